// A fixture of the domain_layering_check test (tests/CMakeLists.txt): it reaches
// gRPC only through another project header, which cmake/check_includes.cmake must
// follow and refuse.
#include "server/session.h"
#include "tests/data/layering_violation_inner.h"
