// An in-process qparams server on a free loopback port, with stubs to call it, for
// the service, conformance-through-the-service, concurrency and CLI tests.

#ifndef QPARAMS_TESTS_SERVICE_TEST_UTIL_H_
#define QPARAMS_TESTS_SERVICE_TEST_UTIL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/status.h"
#include "qparams/v1/qparams.grpc.pb.h"
#include "server/server.h"

namespace qparams::testing {

class TestServer {
 public:
  // Starts a server with `options` on 127.0.0.1 and a port the OS picks.
  static std::unique_ptr<TestServer> Start(ServerOptions options = {}) {
    options.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<QParamsServer>> server = QParamsServer::Start(options);
    if (!server.ok()) return nullptr;
    return std::unique_ptr<TestServer>(new TestServer(*std::move(server)));
  }

  const std::string& address() const { return server_->address(); }
  QParamsServer& server() { return *server_; }

  std::shared_ptr<grpc::Channel> NewChannel() const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // A fresh connection per channel, so clients of one test do not share one.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args);
    // Connected before use: on this VM about one connect in a few thousand to the
    // loopback server fails at once (ENOENT, seen as UNAVAILABLE by every call of
    // that channel, ServiceTest.ConcurrentCreateAndDeleteRaces* 1 run in 40); the
    // channel's own reconnection retries it. A server that is down just costs the wait.
    channel->WaitForConnected(gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                           gpr_time_from_seconds(5, GPR_TIMESPAN)));
    return channel;
  }

  std::unique_ptr<v1::QParamsService::Stub> NewStub() const {
    return v1::QParamsService::NewStub(NewChannel());
  }

 private:
  explicit TestServer(std::unique_ptr<QParamsServer> server) : server_(std::move(server)) {}
  std::unique_ptr<QParamsServer> server_;
};

// absl::Status of a gRPC status, for the EXPECT_CODE family of test_util.h.
inline absl::Status FromGrpc(const grpc::Status& status) { return wire::FromGrpcStatus(status); }

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_SERVICE_TEST_UTIL_H_
