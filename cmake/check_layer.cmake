# Fails (FATAL_ERROR) if any of FILES, or any project header they reach through
# project headers, includes a layer that LAYER may not include. Run at build time
# for every layer folder (cmake/layers.cmake):
#   cmake -DROOT=... -DLAYER=domain -DLAYERS=common;core;... -DALLOWED=common;core;...
#         -DFILES=domain/a.cc;domain/a.h -DPUBLIC_HEADERS=include/qparams/client.h=client
#         -DSTAMP=file -P check_layer.cmake
# LAYERS: every folder that is a layer; ALLOWED: what LAYER may include (itself, the
# layers it declares and what they may include, and the external layers it declares);
# PUBLIC_HEADERS: the headers under include/ that belong to a layer, as path=layer.
#
# The layer of an include:
#   "qparams/v1/types.pb.h"                 types (generated from types/)
#   "qparams/v1/..." and "grpc/health/..."  proto (generated from proto/)
#   "qparams/storage/..."                   storage (generated from storage/)
#   grpc/..., grpcpp/..., grpc++/...        grpc (external)
#   httplib.h                               httplib (external)
#   "tests/<folder>/..." of a test layer    that test layer (tests/support, ...)
#   "<folder>/..." of a folder in LAYERS    that folder
#   "qparams/client.h" of PUBLIC_HEADERS    its layer (include/qparams/client.h: client)
# Any other file under ROOT (tests/data/...) has no layer: it is followed and its
# includes judged as LAYER's. Everything else (Abseil, protobuf, the C++ library) is
# unconstrained. Headers of allowed layers are followed too, so that an external
# layer reached through them counts (the metrics' headers must not bring in httplib).
cmake_minimum_required(VERSION 3.25)

# The public headers' layers, by the path they are included as.
foreach(item ${PUBLIC_HEADERS})
  string(REGEX REPLACE "^include/(.*)=(.*)$" "\\1" path "${item}")
  string(REGEX REPLACE "^.*=" "" layer "${item}")
  set(public_layer_${path} ${layer})
endforeach()

function(layer_of header out)
  if(DEFINED public_layer_${header})
    set(layer ${public_layer_${header}})
  # The core values' messages share the contract's package, not its layer.
  elseif(header STREQUAL "qparams/v1/types.pb.h")
    set(layer types)
  elseif(header MATCHES "^(qparams/v1|grpc/health)/")
    set(layer proto)
  elseif(header MATCHES "^qparams/storage/")
    set(layer storage)
  elseif(header MATCHES "^(grpc|grpcpp|grpc\\+\\+)/")
    set(layer grpc)
  elseif(header STREQUAL "httplib.h")
    set(layer httplib)
  else()
    string(REGEX MATCH "^tests/[^/]+" test_folder "${header}")
    string(REGEX REPLACE "/.*$" "" folder "${header}")
    if(header MATCHES "^tests/[^/]+/" AND test_folder IN_LIST LAYERS)
      set(layer ${test_folder})
    elseif(header MATCHES "/" AND folder IN_LIST LAYERS)
      set(layer ${folder})
    else()
      set(layer "")
    endif()
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

list(JOIN ALLOWED ", " allowed_text)
set(violations)
set(seen)
set(queue ${FILES})
while(queue)
  list(POP_FRONT queue file)
  if(file IN_LIST seen)
    continue()
  endif()
  list(APPEND seen ${file})
  file(STRINGS "${ROOT}/${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*$" "\\1" header "${line}")
    layer_of("${header}" layer)
    if(layer AND NOT layer IN_LIST ALLOWED)
      list(APPEND violations
        "${file} includes ${header} (${layer}): ${LAYER} may include only ${allowed_text}")
    elseif(EXISTS "${ROOT}/${header}")
      list(APPEND queue ${header})
    elseif(DEFINED public_layer_${header})
      list(APPEND queue include/${header})
    endif()
  endforeach()
endwhile()
if(violations)
  # One unwrapped line each, then the error.
  foreach(violation ${violations})
    message(NOTICE "${violation}")
  endforeach()
  message(FATAL_ERROR "${LAYER} includes what the layering (the qparams_layer table of CMakeLists.txt) forbids")
endif()
file(TOUCH "${STAMP}")
