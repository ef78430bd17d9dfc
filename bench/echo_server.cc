#include "bench/echo_server.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "qparams/v1/qparams.pb.h"
#include "server/server.h"

namespace qparams::bench {
namespace {

// One call: reads a request and writes the reply; a streaming call repeats that until
// the client stops writing, a unary one finishes after the first reply.
class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor(bool streaming, const grpc::ByteBuffer& reply)
      : streaming_(streaming), reply_(reply) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (streaming_) {
      StartWrite(&reply_);
    } else {
      StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream ended"));
      return;
    }
    if (streaming_) StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const bool streaming_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
};

class EchoService final : public grpc::CallbackGenericService {
 public:
  EchoService() {
    // About the size of a per-tensor ObserveResponse; any method's client parses it.
    v1::ObserveResponse response;
    response.set_observation_count(1);
    const std::string bytes = response.SerializeAsString();
    grpc::Slice slice(bytes);
    reply_ = grpc::ByteBuffer(&slice, 1);
  }

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new EchoReactor(absl::EndsWith(context->method(), "Stream"), reply_);
  }

 private:
  grpc::ByteBuffer reply_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::Start(int max_message_bytes) {
  std::unique_ptr<EchoServer> server(new EchoServer());
  server->service_ = std::make_unique<EchoService>();
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(server->service_.get());
  ApplyTransportSettings(max_message_bytes, &builder);  // the qparams server's
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError("the echo server cannot listen on 127.0.0.1");
  }
  server->address_ = absl::StrCat("127.0.0.1:", port);
  return server;
}

EchoServer::~EchoServer() {
  if (server_ != nullptr) server_->Shutdown();
}

}  // namespace qparams::bench
