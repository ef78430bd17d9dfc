# Fails (FATAL_ERROR) if any of FILES, or any project header they include, directly
# or through other project headers, includes a header matching FORBIDDEN (a regex).
# Run at build time by server/CMakeLists.txt to keep the domain library free of gRPC
# and of the wire contract: `cmake -DROOT=... -DFILES=a.cc;b.h -DFORBIDDEN=regex
# -DRULE=text -DSTAMP=file -P check_includes.cmake`. Project headers are those
# found under ROOT; generated and system headers are checked by name only.
cmake_minimum_required(VERSION 3.25)

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
    if(header MATCHES "${FORBIDDEN}")
      message(FATAL_ERROR "${file} includes ${header}: ${RULE}")
    endif()
    if(EXISTS "${ROOT}/${header}")
      list(APPEND queue ${header})
    endif()
  endforeach()
endwhile()
file(TOUCH "${STAMP}")
