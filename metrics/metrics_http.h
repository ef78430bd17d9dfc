// The HTTP endpoint Prometheus scrapes: GET /metrics answers a MetricsRegistry's
// Render() in the text exposition format 0.0.4, on cpp-httplib (Debian's
// libcpp-httplib). Nothing else is served; other paths are 404.

#ifndef QPARAMS_METRICS_METRICS_HTTP_H_
#define QPARAMS_METRICS_METRICS_HTTP_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/host_port.h"
#include "metrics/metrics.h"

namespace httplib {
class Server;
}

namespace qparams {

class MetricsHttpServer {
 public:
  // Binds `listen` (parsed by ParseHostPort; port 0 picks a free one) and serves
  // `registry` (which must outlive the server) on a thread of its own, two scrapes at
  // a time. UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const HostPort& listen,
                                                                  const MetricsRegistry* registry);

  // Stops.
  ~MetricsHttpServer();

  // The bound port, and "host:port" with it.
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Closes the listening socket and returns once the scrapes in progress have been
  // answered and the serving thread has ended. Idempotent; not thread-safe (main
  // calls it once the gRPC server has stopped).
  void Stop();

 private:
  MetricsHttpServer();

  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> ended_{false};  // the serving thread returned
  int port_ = 0;
  std::string address_;
};

}  // namespace qparams

#endif  // QPARAMS_METRICS_METRICS_HTTP_H_
