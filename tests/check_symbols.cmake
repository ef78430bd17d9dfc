# Fails (FATAL_ERROR) unless the symbols `nm -C` lists for FILE (an archive or a
# program; defined and undefined, and an archive's member names) match none of
# FORBIDDEN and each of REQUIRED. FORBIDDEN and REQUIRED are comma-separated regexes,
# either may be empty. Run by the client_link_check ctest entries:
# `cmake -DNM=nm -DFILE=libqparams_client.a -DFORBIDDEN=re,re -DREQUIRED=re -P
# check_symbols.cmake`.
cmake_minimum_required(VERSION 3.25)

execute_process(COMMAND "${NM}" -C "${FILE}" OUTPUT_VARIABLE symbols ERROR_VARIABLE error
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} -C ${FILE} failed: ${error}")
endif()
string(REPLACE "," ";" forbidden "${FORBIDDEN}")
string(REPLACE "," ";" required "${REQUIRED}")
set(failures "")
foreach(pattern IN LISTS forbidden)
  string(REGEX MATCH "[^\n]*${pattern}[^\n]*" hit "${symbols}")
  if(hit)
    string(APPEND failures "\n  forbidden /${pattern}/ found: ${hit}")
  else()
    message(STATUS "${FILE}: no symbol matches /${pattern}/")
  endif()
endforeach()
foreach(pattern IN LISTS required)
  string(REGEX MATCH "[^\n]*${pattern}[^\n]*" hit "${symbols}")
  if(hit)
    message(STATUS "${FILE}: /${pattern}/ found: ${hit}")
  else()
    string(APPEND failures "\n  required /${pattern}/ not found")
  endif()
endforeach()
if(failures)
  message(FATAL_ERROR "${FILE}:${failures}")
endif()
