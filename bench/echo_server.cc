#include "bench/echo_server.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "qparams/v1/qparams.pb.h"
#include "server/server.h"

namespace qparams::bench {
namespace {

// The request message of `method` ("/qparams.v1.QParamsService/Observe"), on
// `arena`; null for a method the benchmark does not call.
google::protobuf::Message* NewRequest(absl::string_view method, google::protobuf::Arena* arena) {
  using google::protobuf::Arena;
  if (absl::EndsWith(method, "/Observe") || absl::EndsWith(method, "/ObserveStream")) {
    return Arena::CreateMessage<v1::ObserveRequest>(arena);
  }
  if (absl::EndsWith(method, "/ObserveBatch")) {
    return Arena::CreateMessage<v1::ObserveBatchRequest>(arena);
  }
  if (absl::EndsWith(method, "/Compute")) return Arena::CreateMessage<v1::ComputeRequest>(arena);
  return nullptr;
}

// One call: reads a request (parsing it if asked to) and writes the reply; a
// streaming call repeats that until the client stops writing, a unary one finishes
// after the first reply.
class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor(std::string method, bool streaming, bool parse, const grpc::ByteBuffer& reply)
      : method_(std::move(method)), streaming_(streaming), parse_(parse), reply_(reply) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (parse_) {
      google::protobuf::Arena arena;
      google::protobuf::Message* message = NewRequest(method_, &arena);
      if (message != nullptr) {
        const grpc::Status parsed =
            grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::Message>(&request_,
                                                                                         message);
        if (!parsed.ok()) {
          Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, parsed.error_message()));
          return;
        }
      }
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
  const std::string method_;
  const bool streaming_;
  const bool parse_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
};

class EchoService final : public grpc::CallbackGenericService {
 public:
  explicit EchoService(bool parse) : parse_(parse) {
    // About the size of a per-tensor ObserveResponse; any method's client parses it.
    v1::ObserveResponse response;
    response.set_observation_count(1);
    const std::string bytes = response.SerializeAsString();
    grpc::Slice slice(bytes);
    reply_ = grpc::ByteBuffer(&slice, 1);
  }

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new EchoReactor(context->method(), absl::EndsWith(context->method(), "Stream"), parse_,
                           reply_);
  }

 private:
  const bool parse_;
  grpc::ByteBuffer reply_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::Start(int max_message_bytes, bool parse) {
  std::unique_ptr<EchoServer> server(new EchoServer());
  server->service_ = std::make_unique<EchoService>(parse);
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
