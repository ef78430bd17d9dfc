// What the server tells both of its services, QParamsServiceImpl and
// ClusterAdminServiceImpl: the limits, the logging and who may call what.

#ifndef QPARAMS_SERVER_SERVICE_OPTIONS_H_
#define QPARAMS_SERVER_SERVICE_OPTIONS_H_

#include <cstdint>

#include "core/tensor.h"
#include "metrics/metrics.h"
#include "server/authorizer.h"

namespace qparams {

struct ServiceOptions {
  // Larger well-formed tensors are RESOURCE_EXHAUSTED.
  int64_t max_tensor_elements = kDefaultMaxTensorElements;
  // Log every failed call (method, code, message, peer).
  bool log_failed_rpcs = false;
  // Who may call what (server/authorizer.h). Null: no tokens files (data calls
  // open, cluster control off). Must outlive the services.
  const Authorizer* authorizer = nullptr;
  // Counts the bytes of observation data received (ServerMetrics::received_bytes);
  // null: not counted. Must outlive the services.
  Counter* received_bytes = nullptr;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_SERVICE_OPTIONS_H_
