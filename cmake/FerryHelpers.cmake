# Warnings and sanitizer flags for every ferry target.
add_library(ferry_flags INTERFACE)
target_compile_options(ferry_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  target_compile_options(ferry_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Werror=thread-safety>)
endif()
if(FERRY_SANITIZE)
  string(REPLACE ";" "," _san "${FERRY_SANITIZE}")
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${_san}>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>)
  if("undefined" IN_LIST FERRY_SANITIZE)
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>)
  endif()
  add_link_options(-fsanitize=${_san})
endif()

if(FERRY_WITH_FUZZ AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # Coverage feedback for libFuzzer in every library the fuzzers link.
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
endif()

# ferry_test(NAME SOURCES... LIBS ...): a GoogleTest binary registered with CTest.
function(ferry_test name)
  if(NOT FERRY_WITH_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest_main GTest::gmock ferry_flags)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  add_test(NAME ${name} COMMAND ${name})
  # A binary whose every case skipped (no GPU, not root for the namespaces) shows as skipped,
  # not as passed.
  set_tests_properties(${name} PROPERTIES TIMEOUT 600 SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests\\.")
endfunction()
