# The installed C++ SDK: `cmake --install <build> --prefix P` puts
#   P/include/qparams/client.h            the SDK's public header
#   P/include/qparams/v1/*.pb.h           the wire messages and stubs its API uses
#   P/include/qparams/{core,grpc}/...     the headers client.h names by their source-tree
#                                         paths (core/tensor.h, grpc/health/v1/...)
#   P/lib/libqparams_*.a                  qparams_client and every library it links
#   P/lib/cmake/qparams/                  qparamsConfig.cmake and the export set
# so that a consumer's find_package(qparams CONFIG REQUIRED) gives qparams::client.
# Both P/include and P/include/qparams are the targets' include directories: the
# second resolves client.h's own includes ("core/tensor.h"), which the source tree
# spells the same way. The operator tools and the server are not installed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(QPARAMS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/qparams)

# Installs `targets` into the export set, each exported as qparams::<name without
# qparams_> unless it set its EXPORT_NAME. Their include directories must be
# $<BUILD_INTERFACE:...>: the install tree's are the two above.
function(qparams_install_targets)
  foreach(target ${ARGN})
    get_target_property(export_name ${target} EXPORT_NAME)
    if(NOT export_name)
      string(REGEX REPLACE "^qparams_" "" export_name ${target})
      set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
    endif()
  endforeach()
  install(TARGETS ${ARGN} EXPORT qparamsTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
      ${CMAKE_INSTALL_INCLUDEDIR}/qparams)
endfunction()

# The export set and the package's config files; call once, after every target.
function(qparams_install_package)
  install(EXPORT qparamsTargets NAMESPACE qparams:: DESTINATION ${QPARAMS_INSTALL_CMAKEDIR})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qparamsConfig.cmake.in
    ${PROJECT_BINARY_DIR}/qparamsConfig.cmake INSTALL_DESTINATION ${QPARAMS_INSTALL_CMAKEDIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/qparamsConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/qparamsConfig.cmake
    ${PROJECT_BINARY_DIR}/qparamsConfigVersion.cmake DESTINATION ${QPARAMS_INSTALL_CMAKEDIR})
endfunction()
