// What the server tells both of its services, QParamsServiceImpl and
// ClusterAdminServiceImpl: the limits, the logging and who may call what.

#ifndef QPARAMS_SERVER_SERVICE_OPTIONS_H_
#define QPARAMS_SERVER_SERVICE_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "grpcpp/security/credentials.h"
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
  // The gRPC target through which a replica reaches every replica of its slot map
  // by name (x-qparams-replica): the deployment's router, HAProxy. Set, a client's
  // listing, read or export is answered for every replica (server/fan_out.h); ""
  // answers for this replica's own slots only, as a single server does.
  std::string cluster_address;
  // How to reach cluster_address; null: plaintext (h2c).
  std::shared_ptr<grpc::ChannelCredentials> cluster_credentials;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_SERVICE_OPTIONS_H_
