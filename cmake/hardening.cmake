# The hardening configurations of scripts/ci-hardening.sh, included by the top-level
# CMakeLists.txt before any target exists so that the flags reach every target:
#
#   -DQPARAMS_SANITIZE=address,undefined   ASan + UBSan on everything (the whole ctest suite)
#   -DQPARAMS_SANITIZE=thread              TSan on everything (the concurrency tests)
#   -DQPARAMS_FUZZ=ON                      clang: the libFuzzer targets of fuzz/, on
#                                          libraries built with ASan + UBSan + coverage
#
# UBSan does not recover: its first report fails the test. The Debian libraries
# (gRPC, protobuf, Abseil, OpenMP) stay uninstrumented.

if(QPARAMS_SANITIZE AND QPARAMS_FUZZ)
  message(FATAL_ERROR "QPARAMS_SANITIZE and QPARAMS_FUZZ are separate configurations")
endif()

if(QPARAMS_SANITIZE)
  if(NOT QPARAMS_SANITIZE MATCHES "^(address|undefined|address,undefined|undefined,address|thread)$")
    message(FATAL_ERROR "QPARAMS_SANITIZE is \"${QPARAMS_SANITIZE}\"; use \"\", "
                        "\"address,undefined\" or \"thread\"")
  endif()
  add_compile_options(-fsanitize=${QPARAMS_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${QPARAMS_SANITIZE})

  if(QPARAMS_SANITIZE STREQUAL "thread")
    # Abseil's Mutex/CondVar/Notification live in Debian's uninstrumented
    # libabsl_synchronization.so, so TSan would see no happens-before edge through
    # them (and every absl::Mutex-guarded field would look racy, in our code and in
    # gRPC's hand-offs). sanitizers/tsan_absl_sync.cc interposes them with TSan's
    # mutex annotations, and sanitizers/tsan_grpc_sync.cc does the same for the
    # completion of gRPC's batches (gRPC core is not instrumented either; only its
    # headers are needed: the real functions are found with dlsym). Every
    # executable links both, once all targets exist (deferred to the end of the
    # top-level CMakeLists.txt).
    add_library(qparams_tsan_sync OBJECT
      ${PROJECT_SOURCE_DIR}/sanitizers/tsan_absl_sync.cc
      ${PROJECT_SOURCE_DIR}/sanitizers/tsan_grpc_sync.cc)
    target_include_directories(qparams_tsan_sync PRIVATE
      $<TARGET_PROPERTY:gRPC::grpc,INTERFACE_INCLUDE_DIRECTORIES>)
    target_link_libraries(qparams_tsan_sync PUBLIC absl::synchronization ${CMAKE_DL_LIBS})

    function(qparams_link_tsan_sync dir)
      get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
      foreach(target IN LISTS targets)
        get_target_property(type ${target} TYPE)
        if(type STREQUAL "EXECUTABLE")
          target_link_libraries(${target} PRIVATE qparams_tsan_sync)
          # Export the interposing definitions so that the shared libraries bind to them.
          target_link_options(${target} PRIVATE -rdynamic)
        endif()
      endforeach()
      get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
      foreach(subdir IN LISTS subdirs)
        qparams_link_tsan_sync(${subdir})
      endforeach()
    endfunction()
    cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR}
                   CALL qparams_link_tsan_sync ${PROJECT_SOURCE_DIR})
  endif()
endif()

if(QPARAMS_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "QPARAMS_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Coverage for libFuzzer and ASan + UBSan on every library; the fuzz targets add
  # -fsanitize=fuzzer at link time (fuzz/CMakeLists.txt).
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
