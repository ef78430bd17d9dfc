// Included by layering_violation.h (a fixture): the gRPC include two levels down.
#include "grpcpp/grpcpp.h"
