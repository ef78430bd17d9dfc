// An in-process qparams server on a free loopback port, with stubs to call it, for
// the service, conformance-through-the-service, concurrency and CLI tests.

#ifndef QPARAMS_TESTS_SERVICE_TEST_UTIL_H_
#define QPARAMS_TESTS_SERVICE_TEST_UTIL_H_

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/granularity.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
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
  // The admin calls' service (cluster control), on a channel of its own.
  std::unique_ptr<v1::ClusterAdmin::Stub> NewAdminStub() const {
    return v1::ClusterAdmin::NewStub(NewChannel());
  }

 private:
  explicit TestServer(std::unique_ptr<QParamsServer> server) : server_(std::move(server)) {}
  std::unique_ptr<QParamsServer> server_;
};

// ---- Admin calls (ClusterAdmin: SetSlotMap, SetSlotState, ReadSlotRecords,
// ImportSessions, DropSlots): only a server with --admin_tokens_file takes them, and
// only with an admin token of that file (a server without it refuses them
// PERMISSION_DENIED) ----

// The admin token of the file WriteAdminTokensFile writes. On a server without
// --auth_tokens_file data calls ignore the authorization header, so a client may
// carry it on every call (ClientOptions::bearer_token, qparams-cli --token).
inline constexpr char kTestAdminToken[] = "qparams-test-admin-token-0123";

// Writes `dir`/admin-tokens, holding kTestAdminToken (admin "tests"), and returns
// its path, for ServerOptions::admin_tokens_file (the binary's --admin_tokens_file).
// Removing it is the caller's, with `dir`.
inline std::string WriteAdminTokensFile(const std::string& dir) {
  const std::string path = dir + "/admin-tokens";
  std::ofstream(path) << kTestAdminToken << " tests\n";
  return path;
}

// absl::Status of a gRPC status, for the EXPECT_CODE family of test_util.h.
inline absl::Status FromGrpc(const grpc::Status& status) { return wire::FromGrpcStatus(status); }

// ---- One call per step, for the tests that run vectors through the service ----

// How an observation travels: Observe, an ObserveBatch of one, or an item of an open
// ObserveStream.
enum class ObserveWay { kObserve, kBatch, kStream };
using ObserveStreamRW = grpc::ClientReaderWriter<v1::ObserveRequest, v1::ObserveResponse>;

struct Observed {
  grpc::Status status;  // the observation's own (a batch's or stream's item status)
  v1::ObserveResponse response;
};

// Sends `request` `way` (`stream` is the open stream of kStream). A batch or stream
// that fails as a whole is UNKNOWN, saying so.
inline Observed ObserveOnce(v1::QParamsService::Stub& stub, ObserveWay way, ObserveStreamRW* stream,
                            const v1::ObserveRequest& request) {
  Observed out;
  if (way == ObserveWay::kObserve) {
    grpc::ClientContext context;
    out.status = stub.Observe(&context, request, &out.response);
    return out;
  }
  if (way == ObserveWay::kStream) {
    if (!stream->Write(request) || !stream->Read(&out.response)) {
      out.status = grpc::Status(grpc::StatusCode::UNKNOWN, "the stream broke");
      return out;
    }
  } else {
    grpc::ClientContext context;
    v1::ObserveBatchRequest batch;
    *batch.add_observations() = request;
    v1::ObserveBatchResponse answers;
    if (!stub.ObserveBatch(&context, batch, &answers).ok() || answers.responses_size() != 1) {
      out.status = grpc::Status(grpc::StatusCode::UNKNOWN, "ObserveBatch failed as a whole");
      return out;
    }
    out.response = answers.responses(0);
  }
  out.status = wire::ToGrpcStatus(wire::FromRpcStatus(out.response.status()));
  return out;
}

inline grpc::Status SetExportMode(v1::QParamsService::Stub& stub, const std::string& name,
                                  bool enabled) {
  grpc::ClientContext context;
  v1::SetExportModeRequest request;
  request.set_name(name);
  request.set_enabled(enabled);
  v1::Session response;
  return stub.SetExportMode(&context, request, &response);
}

inline grpc::Status SetGranularity(v1::QParamsService::Stub& stub, const std::string& name,
                                   const Granularity& granularity) {
  grpc::ClientContext context;
  v1::SetGranularityRequest request;
  request.set_name(name);
  *request.mutable_granularity() = wire::GranularityToProto(granularity);
  v1::Session response;
  return stub.SetGranularity(&context, request, &response);
}

inline grpc::Status DeleteSession(v1::QParamsService::Stub& stub, const std::string& name) {
  grpc::ClientContext context;
  v1::DeleteSessionRequest request;
  request.set_name(name);
  v1::DeleteSessionResponse response;
  return stub.DeleteSession(&context, request, &response);
}

// ---- Scale groups (the C++ client has no wrappers for them yet) ----

inline v1::ScaleGroup ScaleGroupOf(const std::string& name, const std::vector<std::string>& members,
                                   v1::ScaleGroup::Share share, bool fill_uncalibrated = false) {
  v1::ScaleGroup group;
  group.set_name(name);
  for (const std::string& member : members) group.add_members(member);
  group.set_share(share);
  group.set_fill_uncalibrated(fill_uncalibrated);
  return group;
}

inline grpc::Status CreateScaleGroup(v1::QParamsService::Stub& stub, const v1::ScaleGroup& group) {
  grpc::ClientContext context;
  v1::CreateScaleGroupRequest request;
  *request.mutable_group() = group;
  v1::ScaleGroup response;
  return stub.CreateScaleGroup(&context, request, &response);
}

inline grpc::Status DeleteScaleGroup(v1::QParamsService::Stub& stub, const std::string& name) {
  grpc::ClientContext context;
  v1::DeleteScaleGroupRequest request;
  request.set_name(name);
  v1::DeleteScaleGroupResponse response;
  return stub.DeleteScaleGroup(&context, request, &response);
}

// Every scale group with every field (create_time included) as ListScaleGroups and
// GetScaleGroup answer, each one's GetGroupQParams (or its refusal), and the answers
// for the names `absent` too, as bytes: equal bytes, equal groups bit for bit.
inline std::string ScaleGroupState(v1::QParamsService::Stub& stub,
                                   const std::vector<std::string>& absent = {}) {
  std::string out;
  grpc::ClientContext list_context;
  v1::ListScaleGroupsRequest list;
  list.set_page_size(1000);
  v1::ListScaleGroupsResponse all;
  if (grpc::Status s = stub.ListScaleGroups(&list_context, list, &all); !s.ok()) {
    return FromGrpc(s).ToString();
  }
  out += all.SerializeAsString();
  std::vector<std::string> names = absent;
  for (const v1::ScaleGroup& group : all.groups()) names.push_back(group.name());
  for (const std::string& name : names) {
    grpc::ClientContext get_context;
    v1::GetScaleGroupRequest get;
    get.set_name(name);
    v1::ScaleGroup group;
    grpc::Status s = stub.GetScaleGroup(&get_context, get, &group);
    out += s.ok() ? group.SerializeAsString() : FromGrpc(s).ToString();
    grpc::ClientContext shared_context;
    v1::GetGroupQParamsRequest shared;
    shared.set_name(name);
    v1::GroupQParams result;
    s = stub.GetGroupQParams(&shared_context, shared, &result);
    out += s.ok() ? result.SerializeAsString() : FromGrpc(s).ToString();
  }
  return out;
}

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_SERVICE_TEST_UTIL_H_
