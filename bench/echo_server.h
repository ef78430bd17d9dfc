// The ceilings qparams-bench measures the service against: a gRPC server of the same
// build that answers every call of every method, unary or streaming, with one tiny
// message and does nothing else. The plain echo does not even parse the request;
// the parsing echo parses it into its qparams.v1 request message with the same
// generated code and gRPC deserializer the service uses (on an arena, as the
// service's hot methods do), then answers the same way. A client of
// qparams.v1.QParamsService can call either unchanged.

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
  // `max_message_bytes`; parses each request first if `parse`. UNAVAILABLE if it
  // cannot listen; a request that does not parse is answered INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start(int max_message_bytes,
                                                           bool parse = false);

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
