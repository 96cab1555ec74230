# pl_optim_test(NAME SOURCES a.c PLUGINS p1 p2): a plugin test built with the
# optimizer test kit (optim_testkit.c, over the public harness pipeline/testing.h)
# and cJSON; public headers only.
set(PL_OPTIM_COMMON_DIR ${CMAKE_CURRENT_LIST_DIR}) # tests/kits: optim_testkit, prec_model
function(pl_optim_test name)
  cmake_parse_arguments(T "" "" "SOURCES;PLUGINS" ${ARGN})
  if(NOT PL_BUILD_TESTS)
    return()
  endif()
  pl_add_test(${name} SOURCES ${T_SOURCES} ${PL_OPTIM_COMMON_DIR}/optim_testkit.c
              LIBS PkgConfig::CJSON m LABELS optim)
  target_include_directories(${name} PRIVATE ${PL_OPTIM_COMMON_DIR})
  foreach(p ${T_PLUGINS})
    add_dependencies(${name} plugin_${p})
  endforeach()
endfunction()
