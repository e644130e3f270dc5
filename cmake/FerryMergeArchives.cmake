# cmake -DAR=... -DRANLIB=... -DMRI=<script> -DOUT=<archive> -P FerryMergeArchives.cmake
# Runs `ar -M` on the MRI script that FerryInstall.cmake writes (CREATE, ADDLIB..., SAVE), then
# indexes the archive. A script, because a custom command cannot redirect stdin portably.
execute_process(COMMAND ${AR} -M INPUT_FILE ${MRI} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ar -M ${MRI} failed: ${rc}")
endif()
execute_process(COMMAND ${RANLIB} ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ranlib ${OUT} failed: ${rc}")
endif()
