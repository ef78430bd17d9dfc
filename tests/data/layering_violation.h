// A fixture of the domain_layering_check test (tests/CMakeLists.txt), checked with
// the domain's rules: it includes the domain (allowed), a layer above it, and gRPC
// only through another project header, which cmake/check_layer.cmake must follow.
#include "domain/session.h"
#include "export/exporter.h"
#include "tests/data/layering_violation_inner.h"
