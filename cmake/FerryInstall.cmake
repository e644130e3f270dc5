# Installing ferry (SPDX-License-Identifier: Apache-2.0). Included after every target exists.
#
# `cmake --install <build>` installs, under the prefix:
#   include/ferry/*.h                 the public headers (standard and ferry headers only)
#   <libdir>/libferry.so              ferry's libraries (engine, transports, kv, embed, embed
#                                     service) linked whole into one shared library
#   <libdir>/libferry.a               the same static libraries merged into one archive
#   <libdir>/cmake/ferry/             find_package(ferry): ferry::ferry (the shared library),
#                                     ferry::ferry_static with COMPONENTS static
#   <libdir>/pkgconfig/ferry.pc       and ferry-static.pc
#   bin/ferry                         the command-line tool
#   share/doc/ferry/LICENSE
# The Python package is the component `python`, installed only when asked for
# (`cmake --install <build> --component python`; pip's build does so through pyproject.toml).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FERRY_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

# Every ferry static library under the public headers' implementations, found by walking the
# link libraries, so that a new transport or layer is included without a change here.
set(_queue ferry_engine ferry_kv ferry_embed ferry_embed_service)
set(FERRY_INSTALL_STATIC_LIBS "")
while(_queue)
  list(POP_FRONT _queue _t)
  if(NOT TARGET ${_t} OR NOT _t MATCHES "^ferry_" OR _t IN_LIST FERRY_INSTALL_STATIC_LIBS)
    continue()
  endif()
  get_target_property(_type ${_t} TYPE)
  if(NOT _type STREQUAL "STATIC_LIBRARY")
    continue()
  endif()
  list(APPEND FERRY_INSTALL_STATIC_LIBS ${_t})
  get_target_property(_deps ${_t} LINK_LIBRARIES)
  if(_deps)
    list(APPEND _queue ${_deps})
  endif()
endwhile()

# libferry.so: the static libraries (all PIC: CMAKE_POSITION_INDEPENDENT_CODE) linked whole.
# --no-undefined proves that nothing is missing; --exclude-libs keeps the CUDA runtime's symbols
# private, so that a process that also loads libcudart.so (PyTorch) keeps calling its own.
file(WRITE ${CMAKE_BINARY_DIR}/ferry_shared.cc
     "// libferry.so is ferry's static libraries linked whole (cmake/FerryInstall.cmake).\n")
add_library(ferry_shared SHARED ${CMAKE_BINARY_DIR}/ferry_shared.cc)
set(_whole "")
foreach(_t IN LISTS FERRY_INSTALL_STATIC_LIBS)
  list(APPEND _whole "$<TARGET_FILE:${_t}>")
endforeach()
target_link_options(ferry_shared PRIVATE LINKER:--whole-archive ${_whole} LINKER:--no-whole-archive
                    LINKER:--exclude-libs,libcudart_static.a)
if(NOT FERRY_SANITIZE)  # a sanitizer's runtime is linked into programs only
  target_link_options(ferry_shared PRIVATE LINKER:--no-undefined)
endif()
# Linked normally too, for their own dependencies (UCX, spdlog, the CUDA runtime) and the build
# order; every member is already in from the whole archives above.
target_link_libraries(ferry_shared PRIVATE ${FERRY_INSTALL_STATIC_LIBS})
target_include_directories(ferry_shared INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(ferry_shared INTERFACE cxx_std_20)
set_target_properties(ferry_shared PROPERTIES
  OUTPUT_NAME ferry EXPORT_NAME ferry_shared LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  LINK_DEPENDS "${_whole}")

# libferry.a: the same archives merged by `ar -M` (members keep their names; duplicate names
# such as each transport's transport.cc.o are kept as separate members).
set(FERRY_STATIC_ARCHIVE ${CMAKE_BINARY_DIR}/lib/libferry.a)
set(_mri "CREATE ${FERRY_STATIC_ARCHIVE}\n")
foreach(_t IN LISTS FERRY_INSTALL_STATIC_LIBS)
  string(APPEND _mri "ADDLIB $<TARGET_FILE:${_t}>\n")
endforeach()
string(APPEND _mri "SAVE\nEND\n")
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/ferry_static.mri CONTENT "${_mri}")
add_custom_command(OUTPUT ${FERRY_STATIC_ARCHIVE}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/lib
  COMMAND ${CMAKE_COMMAND} -E rm -f ${FERRY_STATIC_ARCHIVE}
  COMMAND ${CMAKE_COMMAND} -DAR=${CMAKE_AR} -DRANLIB=${CMAKE_RANLIB}
          -DMRI=${CMAKE_BINARY_DIR}/ferry_static.mri -DOUT=${FERRY_STATIC_ARCHIVE}
          -P ${CMAKE_CURRENT_LIST_DIR}/FerryMergeArchives.cmake
  DEPENDS ${FERRY_INSTALL_STATIC_LIBS} ${_whole} ${CMAKE_BINARY_DIR}/ferry_static.mri
  COMMENT "Merging ferry's static libraries into libferry.a" VERBATIM)
add_custom_target(ferry_static_archive ALL DEPENDS ${FERRY_STATIC_ARCHIVE})

# What a program linking libferry.a needs besides it (the shared library records its own).
set(FERRY_STATIC_PC_LIBS "-lrt -pthread")
if(FERRY_HAVE_CUDA)
  get_target_property(_cudart CUDA::cudart_static IMPORTED_LOCATION)
  string(APPEND FERRY_STATIC_PC_LIBS " ${_cudart} -ldl")
  set(FERRY_CUDA_TOOLKIT_ROOT ${CUDAToolkit_LIBRARY_ROOT})
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(TARGETS ferry_shared EXPORT ferryTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(FILES ${FERRY_STATIC_ARCHIVE} DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${FERRY_INSTALL_CMAKEDIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ferryConfig.cmake.in
  ${CMAKE_BINARY_DIR}/ferryConfig.cmake INSTALL_DESTINATION ${FERRY_INSTALL_CMAKEDIR}
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
# 0.x releases may change the API in a minor version, so only the same minor is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ferryConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ferryConfig.cmake ${CMAKE_BINARY_DIR}/ferryConfigVersion.cmake
        DESTINATION ${FERRY_INSTALL_CMAKEDIR} COMPONENT dev)

# pkg-config files find the prefix from their own place, so a copy installed with
# `cmake --install --prefix` anywhere is right.
file(RELATIVE_PATH FERRY_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" FERRY_PC_TO_PREFIX "${FERRY_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/ferry.pc.in ${CMAKE_BINARY_DIR}/ferry.pc @ONLY)
configure_file(${CMAKE_CURRENT_LIST_DIR}/ferry-static.pc.in ${CMAKE_BINARY_DIR}/ferry-static.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/ferry.pc ${CMAKE_BINARY_DIR}/ferry-static.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT dev)

install(TARGETS ferry RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)

if(TARGET _ferry)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  # Default: the interpreter's own layout under the prefix (lib/python3.11/site-packages).
  execute_process(COMMAND ${Python3_EXECUTABLE} -c
      "import sysconfig; print(sysconfig.get_path('platlib', vars={'platbase': '', 'base': ''}).lstrip('/'))"
    OUTPUT_VARIABLE _pydir OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(FERRY_INSTALL_PYTHONDIR "${_pydir}" CACHE STRING
      "Where `cmake --install --component python` puts the ferry package, under the prefix")
  install(TARGETS _ferry LIBRARY DESTINATION ${FERRY_INSTALL_PYTHONDIR}/ferry
          COMPONENT python EXCLUDE_FROM_ALL)
  file(GLOB _py CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/ferry/*.py)
  install(FILES ${_py} DESTINATION ${FERRY_INSTALL_PYTHONDIR}/ferry COMPONENT python EXCLUDE_FROM_ALL)
  # The module's type stubs and the PEP 561 marker, so that type checkers and IDEs see ferry's
  # signatures (the compiled module has none of its own).
  install(FILES ${PROJECT_SOURCE_DIR}/python/ferry/_ferry.pyi ${PROJECT_SOURCE_DIR}/python/ferry/py.typed
          DESTINATION ${FERRY_INSTALL_PYTHONDIR}/ferry COMPONENT python EXCLUDE_FROM_ALL)
endif()

if(FERRY_WITH_TESTS AND NOT FERRY_SANITIZE)
  add_subdirectory(${PROJECT_SOURCE_DIR}/tests/install ${CMAKE_BINARY_DIR}/tests/install)
endif()
