# pl_optim_test(NAME SOURCES a.c PLUGINS p1 p2): a plugin test built with the
# optimizer test kit (optim_testkit.c), cJSON, the core's internal headers
# (registry, config, run objects) and the fixture loader/model plugins.
set(PL_OPTIM_COMMON_DIR ${CMAKE_CURRENT_LIST_DIR})
function(pl_optim_test name)
  cmake_parse_arguments(T "" "" "SOURCES;PLUGINS" ${ARGN})
  if(NOT PL_BUILD_TESTS)
    return()
  endif()
  pl_add_test(${name} SOURCES ${T_SOURCES} ${PL_OPTIM_COMMON_DIR}/optim_testkit.c
              LIBS PkgConfig::CJSON m LABELS optim)
  target_include_directories(${name} PRIVATE ${PL_OPTIM_COMMON_DIR}
                             ${PROJECT_SOURCE_DIR}/core/src)
  target_compile_definitions(${name} PRIVATE
    PL_FIXTURE_GOOD_DIR="${CMAKE_BINARY_DIR}/tests/fixtures/plugins/good")
  foreach(p ${T_PLUGINS})
    add_dependencies(${name} plugin_${p})
  endforeach()
  add_dependencies(${name} fixture_good_fx_loader fixture_good_fx_model)
endfunction()
