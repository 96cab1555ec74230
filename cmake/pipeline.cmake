# pl_add_plugin(NAME SOURCES a.c b.c [LIBS x y] [COMPONENT c])
#   builds NAME.so into ${PL_PLUGIN_BUILD_DIR} and installs it under
#   lib/pipeline/plugins, in install component `plugins` (or COMPONENT: the
#   cpu backend is `runtime`, which every program needs).
function(pl_add_plugin name)
  cmake_parse_arguments(P "" "COMPONENT" "SOURCES;LIBS" ${ARGN})
  if(NOT P_COMPONENT)
    set(P_COMPONENT plugins)
  endif()
  add_library(plugin_${name} MODULE ${P_SOURCES})
  target_link_libraries(plugin_${name} PRIVATE pipeline_core ${P_LIBS})
  set_target_properties(plugin_${name} PROPERTIES
    PREFIX "" OUTPUT_NAME ${name}
    LIBRARY_OUTPUT_DIRECTORY ${PL_PLUGIN_BUILD_DIR}
    C_VISIBILITY_PRESET hidden)
  install(TARGETS plugin_${name} LIBRARY DESTINATION ${PL_PLUGIN_INSTALL_DIR} COMPONENT ${P_COMPONENT})
endfunction()

# pl_add_test(NAME SOURCES a.c [LIBS x] [LABELS l])
#   a Check test executable run by ctest from the source root (so tests can
#   read ../shared/data relative to the project), with the build's plugin dir.
#   Linked to the core, to the public test harness (libpipeline_testing,
#   pipeline/testing.h), which every plugin test builds its stage with, and to
#   the file formats (libpipeline_io: pl_test.c saves and reads safetensors).
function(pl_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/common/pl_test.c)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  target_link_libraries(${name} PRIVATE pipeline_testing pipeline_io pipeline_core PkgConfig::CHECK ${T_LIBS})
  target_compile_definitions(${name} PRIVATE
    PL_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    PL_TEST_BINARY_DIR="${PROJECT_BINARY_DIR}"
    PL_TEST_PLUGIN_DIR="${PL_PLUGIN_BUILD_DIR}")
  # the CPU backend plugin, which the core loads on the first CPU op (a test
  # built alone, `--target NAME`, has it too)
  add_dependencies(${name} plugin_cpu)
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "CK_DEFAULT_TIMEOUT=${T_TIMEOUT};PIPELINE_PLUGIN_PATH=${PL_PLUGIN_BUILD_DIR}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
