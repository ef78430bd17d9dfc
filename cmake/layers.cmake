# The layering: every layer is a folder of the source tree, built as the targets
# named here, which may include only the layers it declares (and what those may
# include). The table is the one call of qparams_layer per folder in the top-level
# CMakeLists.txt, lowest first; qparams_check_layers() then checks
#   - at configure time, that no target of a layer links a target of a layer (or an
#     external one) it may not include: the targets' graph is the table's;
#   - at build time, that no file of a folder, nor a project header it reaches,
#     includes a layer the folder may not (cmake/check_layer.cmake; the build fails
#     naming the file, the include and the rule);
#   - at build time, that every library of a folder links whole, with nothing but
#     the dependencies its target declares (an executable each, cmake/link_check.cc).

# The tests are layers too, declared after the table with qparams_test_layer: a folder
# of tests/ per layer they reach, named tests/<folder>, under the same checks (a domain
# test that includes a server/ header, or links qparams_server, fails the build). No
# layer of the table may include them, being declared before them.

# Layers outside the source tree, allowed only where declared (they do not pass on
# to the layers above).
set(QPARAMS_EXTERNAL_LAYERS grpc httplib)

# qparams_layer(NAME [MAY_INCLUDE layer...] [PUBLIC_HEADERS folder] [TARGETS target...])
# PUBLIC_HEADERS: a folder under include/ (on the include path) whose headers belong to
# the layer too, included as "<path under include/>" (include/qparams/client.h is
# "qparams/client.h"): a library's installed headers.
function(qparams_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PUBLIC_HEADERS" "MAY_INCLUDE;TARGETS")
  get_property(layers GLOBAL PROPERTY QPARAMS_LAYERS)
  if(name IN_LIST layers)
    message(FATAL_ERROR "layer ${name} is declared twice")
  endif()
  set(allowed ${name})
  foreach(dep ${arg_MAY_INCLUDE})
    if(dep IN_LIST QPARAMS_EXTERNAL_LAYERS)
      list(APPEND allowed ${dep})
    elseif(dep IN_LIST layers)
      get_property(dep_allowed GLOBAL PROPERTY QPARAMS_LAYER_${dep}_PROJECT)
      list(APPEND allowed ${dep_allowed})
    else()
      message(FATAL_ERROR "layer ${name} may include ${dep}, which is not a layer declared before it")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES allowed)
  set(project_allowed ${allowed})
  list(REMOVE_ITEM project_allowed ${QPARAMS_EXTERNAL_LAYERS})
  set_property(GLOBAL APPEND PROPERTY QPARAMS_LAYERS ${name})
  set_property(GLOBAL PROPERTY QPARAMS_LAYER_${name}_ALLOWED ${allowed})
  set_property(GLOBAL PROPERTY QPARAMS_LAYER_${name}_PROJECT ${project_allowed})
  set_property(GLOBAL PROPERTY QPARAMS_LAYER_${name}_TARGETS ${arg_TARGETS})
  set_property(GLOBAL PROPERTY QPARAMS_LAYER_${name}_PUBLIC_HEADERS ${arg_PUBLIC_HEADERS})
endfunction()

# qparams_test_layer(FOLDER [MAY_INCLUDE layer...] [TARGETS target...]): the tests of
# tests/FOLDER, as the layer tests/FOLDER. MAY_INCLUDE names layers of the table and
# test layers declared before (tests/support), with what they may include.
function(qparams_test_layer folder)
  qparams_layer(tests/${folder} ${ARGN})
endfunction()

# The files of a layer, relative to the source tree: its folder's and its public headers.
function(qparams_layer_files name out)
  get_property(public GLOBAL PROPERTY QPARAMS_LAYER_${name}_PUBLIC_HEADERS)
  set(patterns ${PROJECT_SOURCE_DIR}/${name}/*.h ${PROJECT_SOURCE_DIR}/${name}/*.cc)
  if(public)
    list(APPEND patterns ${PROJECT_SOURCE_DIR}/${public}/*.h)
  endif()
  file(GLOB files CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR} ${patterns})
  set(${out} ${files} PARENT_SCOPE)
endfunction()

# Every layer's public headers as "path=layer" items, path relative to the source tree.
function(qparams_public_headers out)
  get_property(layers GLOBAL PROPERTY QPARAMS_LAYERS)
  set(items)
  foreach(name ${layers})
    get_property(public GLOBAL PROPERTY QPARAMS_LAYER_${name}_PUBLIC_HEADERS)
    if(public)
      file(GLOB headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
        ${PROJECT_SOURCE_DIR}/${public}/*.h)
      list(TRANSFORM headers APPEND "=${name}")
      list(APPEND items ${headers})
    endif()
  endforeach()
  set(${out} ${items} PARENT_SCOPE)
endfunction()

# The layer of a link item: a layer's target, gRPC's or httplib's; "" for any other.
function(qparams_layer_of_target item out)
  set(layer "")
  if(item MATCHES "^gRPC::")
    set(layer grpc)
  elseif(item STREQUAL "PkgConfig::HTTPLIB")
    set(layer httplib)
  else()
    get_property(layers GLOBAL PROPERTY QPARAMS_LAYERS)
    foreach(name ${layers})
      get_property(targets GLOBAL PROPERTY QPARAMS_LAYER_${name}_TARGETS)
      if(item IN_LIST targets)
        set(layer ${name})
      endif()
    endforeach()
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

# The check and link targets of every declared layer; call once, after the table.
function(qparams_check_layers)
  get_property(layers GLOBAL PROPERTY QPARAMS_LAYERS)
  foreach(name ${layers})
    get_property(allowed GLOBAL PROPERTY QPARAMS_LAYER_${name}_ALLOWED)
    get_property(targets GLOBAL PROPERTY QPARAMS_LAYER_${name}_TARGETS)
    foreach(target ${targets})
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "INTERFACE_LIBRARY")
        get_target_property(links ${target} INTERFACE_LINK_LIBRARIES)
      else()
        get_target_property(links ${target} LINK_LIBRARIES)
      endif()
      foreach(item ${links})
        qparams_layer_of_target("${item}" layer)
        if(layer AND NOT layer IN_LIST allowed)
          list(JOIN allowed ", " allowed_text)
          message(FATAL_ERROR
            "${target} (layer ${name}) links ${item} (${layer}): ${name} may include only ${allowed_text}")
        endif()
      endforeach()
    endforeach()
  endforeach()
  qparams_public_headers(public_headers)
  foreach(name ${layers})
    get_property(allowed GLOBAL PROPERTY QPARAMS_LAYER_${name}_ALLOWED)
    get_property(project_allowed GLOBAL PROPERTY QPARAMS_LAYER_${name}_PROJECT)
    get_property(targets GLOBAL PROPERTY QPARAMS_LAYER_${name}_TARGETS)
    qparams_layer_files(${name} files)
    # A test layer's name has a slash: tests/core's check is qparams_tests_core_layer.
    string(MAKE_C_IDENTIFIER "${name}" id)
    # Rerun when a file of the layer, or of a layer it may include, changes.
    set(depends)
    foreach(layer ${project_allowed})
      qparams_layer_files(${layer} layer_files)
      list(APPEND depends ${layer_files})
    endforeach()
    list(TRANSFORM depends PREPEND ${PROJECT_SOURCE_DIR}/)
    set(stamp ${PROJECT_BINARY_DIR}/qparams_${id}_layer.stamp)
    add_custom_command(OUTPUT ${stamp}
      COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -DLAYER=${name}
        "-DLAYERS=${layers}" "-DALLOWED=${allowed}" "-DFILES=${files}"
        "-DPUBLIC_HEADERS=${public_headers}" -DSTAMP=${stamp}
        -P ${PROJECT_SOURCE_DIR}/cmake/check_layer.cmake
      DEPENDS ${depends} ${PROJECT_SOURCE_DIR}/cmake/check_layer.cmake
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
      COMMENT "Checking the includes of layer ${name}"
      VERBATIM)
    add_custom_target(qparams_${id}_layer DEPENDS ${stamp})
    foreach(target ${targets})
      add_dependencies(${target} qparams_${id}_layer)
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "STATIC_LIBRARY")
        add_executable(${target}_link_check ${PROJECT_SOURCE_DIR}/cmake/link_check.cc)
        target_link_libraries(${target}_link_check PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,${target}>")
      endif()
    endforeach()
  endforeach()
endfunction()
