// A running qparams server: QParamsService, gRPC health and server reflection on
// one listening address. main() only parses flags and wires signals to Shutdown.

#ifndef QPARAMS_SERVER_SERVER_H_
#define QPARAMS_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/engine.h"
#include "server/qparams_service.h"

namespace qparams {

struct ServerOptions {
  // host:port; port 0 picks a free port (see QParamsServer::port()).
  std::string listen = "127.0.0.1:50051";
  // gRPC's receive limit; larger requests fail with RESOURCE_EXHAUSTED.
  int max_message_bytes = 64 << 20;
  EngineOptions engine;
  ServiceOptions service;
};

class QParamsServer {
 public:
  // The name health reports for the service (besides "" for the whole server).
  static constexpr char kServiceName[] = "qparams.v1.QParamsService";

  // Binds `options.listen` and starts serving. UNAVAILABLE if the address cannot be
  // bound, INVALID_ARGUMENT for a malformed address.
  static absl::StatusOr<std::unique_ptr<QParamsServer>> Start(const ServerOptions& options);

  ~QParamsServer();

  // The bound port and "host:port" address (with the port resolved).
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Health turns NOT_SERVING, new calls are refused, in-flight calls get until
  // `grace` to finish and are cancelled after it. Returns when all have ended.
  // Idempotent and thread-safe.
  void Shutdown(absl::Duration grace);

  // Blocks until Shutdown has completed.
  void Wait();

  Engine& engine() { return engine_; }

 private:
  QParamsServer(const ServerOptions& options);

  Engine engine_;
  QParamsServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_SERVER_H_
