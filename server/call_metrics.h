// Counts and times every call of qparams.v1.QParamsService and qparams.v1.ClusterAdmin
// where gRPC sends its status: a server interceptor, so that every method, unary or
// streaming, present or added later, passes through the one place, and the services
// stay translations.

#ifndef QPARAMS_SERVER_CALL_METRICS_H_
#define QPARAMS_SERVER_CALL_METRICS_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/server_metrics.h"

namespace qparams {

// Gives each call of either service an interceptor that, when the call's status is
// sent (PRE_SEND_STATUS), adds one to qparams_calls_total{method,code} (the method's
// name alone: no two methods of the services share one) and its time since
// the call arrived to qparams_call_duration_seconds. A call that ends without a
// status sent (cancelled before the handler finished) counts as CANCELLED when its
// interceptor is destroyed. Calls of other services (health, reflection) get none.
//
// Thread safety: gRPC calls CreateServerInterceptor from any thread; the series of a
// (method, code) are looked up in the registry once, then recorded lock-free.
class CallMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `metrics` must outlive the server.
  explicit CallMetricsInterceptorFactory(const ServerMetrics* metrics);
  ~CallMetricsInterceptorFactory() override;

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

  struct Method;  // call_metrics.cc

 private:
  // By gRPC's method path, "/qparams.v1.QParamsService/Observe",
  // "/qparams.v1.ClusterAdmin/SetSlotMap"; fixed after the constructor.
  absl::flat_hash_map<std::string, std::unique_ptr<Method>> methods_;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_CALL_METRICS_H_
