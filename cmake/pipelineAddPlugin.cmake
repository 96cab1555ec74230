# pipeline_add_plugin(NAME SOURCES a.c b.c [LIBS x y])
#   Builds the plugin NAME.so (a MODULE: no lib prefix, hidden visibility so
#   that PL_PLUGIN_DEFINE's pl_plugin_entry is the one exported symbol) linked
#   to pipeline::core, and installs it under <your prefix>/lib/pipeline/plugins.
#   NAME must equal the name given to PL_PLUGIN_DEFINE: the registry refuses a
#   file whose descriptor names another plugin. Undefined symbols fail the
#   link (not the dlopen at run time).
#   Part of the installed pipeline CMake package (pipelineConfig.cmake).
include_guard(GLOBAL)
include(GNUInstallDirs)

function(pipeline_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT name MATCHES "^[A-Za-z0-9_-]+$")
    message(FATAL_ERROR "pipeline_add_plugin: plugin name '${name}' must match [A-Za-z0-9_-]+")
  endif()
  if(NOT P_SOURCES)
    message(FATAL_ERROR "pipeline_add_plugin(${name}): no SOURCES given")
  endif()
  if(P_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "pipeline_add_plugin(${name}): unexpected arguments: ${P_UNPARSED_ARGUMENTS}")
  endif()
  add_library(${name} MODULE ${P_SOURCES})
  target_link_libraries(${name} PRIVATE pipeline::core ${P_LIBS})
  set_target_properties(${name} PROPERTIES
    PREFIX "" OUTPUT_NAME ${name} SUFFIX ".so"
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_link_options(${name} PRIVATE "LINKER:--no-undefined")
  endif()
  install(TARGETS ${name} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/pipeline/plugins)
endfunction()
