// The ceiling qparams-bench measures the service against: a gRPC server of the same
// build that answers every call of every method, unary or streaming, with one tiny
// message and does nothing else (it does not even parse the request). A client of
// qparams.v1.QParamsService can call it unchanged.

#ifndef QPARAMS_BENCH_ECHO_SERVER_H_
#define QPARAMS_BENCH_ECHO_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

namespace qparams::bench {

class EchoServer {
 public:
  // Serves on 127.0.0.1 at a port the OS picks, accepting requests of up to
  // `max_message_bytes`. UNAVAILABLE if it cannot listen.
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start(int max_message_bytes);

  ~EchoServer();

  const std::string& address() const { return address_; }

 private:
  EchoServer() = default;

  std::unique_ptr<grpc::CallbackGenericService> service_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace qparams::bench

#endif  // QPARAMS_BENCH_ECHO_SERVER_H_
