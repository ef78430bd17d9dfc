// The HTTP endpoint Prometheus scrapes and health checks ask, on cpp-httplib
// (Debian's libcpp-httplib): GET /metrics answers a MetricsRegistry's Render() in
// the text exposition format 0.0.4; GET /healthz and GET /livez answer 200 with the
// body "SERVING\n" while their check is OK, else 503 with "NOT_SERVING: <the
// status's message>\n" (text/plain, never cached). Other paths are 404. What the
// checks mean is the caller's (server/server.h: Readiness, Liveness); this layer
// only serves them.

#ifndef QPARAMS_METRICS_METRICS_HTTP_H_
#define QPARAMS_METRICS_METRICS_HTTP_H_

#include <atomic>
#include <functional>
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

// The checks behind GET /healthz and GET /livez: called on a serving thread for
// each request, so thread-safe, and valid until the server is stopped.
struct HttpHealthChecks {
  std::function<absl::Status()> ready;  // /healthz: may this process take traffic?
  std::function<absl::Status()> live;   // /livez: is it worth keeping (or only a restart helps)?
};

class MetricsHttpServer {
 public:
  // Binds `listen` (parsed by ParseHostPort; port 0 picks a free one) and serves
  // `registry` (which must outlive the server) and `health` on a thread of its own,
  // two requests at a time. INVALID_ARGUMENT if a check is missing, UNAVAILABLE if
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const HostPort& listen,
                                                                  const MetricsRegistry* registry,
                                                                  HttpHealthChecks health);

  // Stops.
  ~MetricsHttpServer();

  // The bound port, and "host:port" with it.
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Closes the listening socket and returns once the requests in progress have been
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
