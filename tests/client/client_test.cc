// qparams::Client against an in-process server: typed calls, status codes and
// messages carried over, tensors encoded for the caller, and ObserveStream.

#include "qparams/client.h"

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/slot.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using google::protobuf::util::MessageDifferencer;
using grpc::health::v1::HealthCheckResponse;

v1::CreateSessionRequest CreateRequest(const std::string& name, const v1::QuantSpec& spec = {}) {
  v1::CreateSessionRequest request;
  request.set_name(name);
  *request.mutable_spec() = spec;
  return request;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(server_->address()));
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, ConnectRejectsBadOptions) {
  EXPECT_CODE(Client::Connect(""), kInvalid);
  ClientOptions no_time;
  no_time.timeout = absl::ZeroDuration();
  EXPECT_CODE(Client::Connect(server_->address(), no_time), kInvalid);
  ClientOptions no_bytes;
  no_bytes.max_message_bytes = 0;
  EXPECT_CODE(Client::Connect(server_->address(), no_bytes), kInvalid);
  ClientOptions name_without_tls;
  name_without_tls.tls_server_name = "localhost";
  EXPECT_CODE(Client::Connect(server_->address(), name_without_tls), kInvalid);
  // Tokens metadata cannot carry; the message does not repeat them.
  for (const std::string& token :
       std::vector<std::string>{"with space-0123456789", "with\nnewline-0123456789",
                                "caf\xc3\xa9-0123456789", std::string(4097, 't')}) {
    ClientOptions bad_token;
    bad_token.bearer_token = token;
    const absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(server_->address(), bad_token);
    EXPECT_CODE(client, kInvalid);
    EXPECT_FALSE(absl::StrContains(client.status().message(), "0123456789")) << client.status();
  }
}

// A server without authentication ignores a token.
TEST_F(ClientTest, TokenIsHarmlessOnAnOpenServer) {
  ClientOptions options;
  options.bearer_token = "some-token-0123456789";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(server_->address(), options));
  EXPECT_OK(client->CreateSession(CreateRequest("t")));
  EXPECT_OK(client->ObserveStream({TensorObservation("t", F32({2}, {1, 2}).view())}));
  EXPECT_OK(client->Health());
}

TEST(TlsCredentialsTest, ChecksItsFilesWithoutOpenssl) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/client_test.XXXXXX");
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string text = absl::StrCat(dir, "/text.pem");
  std::ofstream(text) << "not a certificate\n";
  const std::string missing = absl::StrCat(dir, "/missing.pem");

  EXPECT_OK(TlsCredentials("", "", ""));  // the default roots
  const absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> no_ca =
      TlsCredentials(missing, "", "");
  EXPECT_CODE(no_ca, kPrecondition);
  EXPECT_TRUE(absl::StrContains(no_ca.status().message(), missing)) << no_ca.status();
  EXPECT_CODE(TlsCredentials(dir, "", ""), kPrecondition);  // a directory
  const absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> not_pem =
      TlsCredentials(text, "", "");
  EXPECT_CODE(not_pem, kInvalid);
  EXPECT_TRUE(absl::StrContains(not_pem.status().message(), text)) << not_pem.status();
  // Both or neither of the certificate and the key, checked before any file.
  EXPECT_CODE(TlsCredentials("", missing, ""), kInvalid);
  EXPECT_CODE(TlsCredentials("", "", missing), kInvalid);
  EXPECT_CODE(TlsCredentials("", missing, missing), kPrecondition);
  std::filesystem::remove_all(dir);
}

TEST_F(ClientTest, CallsCarryTheServersCodeAndMessage) {
  const absl::StatusOr<v1::Session> missing = client_->GetSession("absent");
  EXPECT_CODE(missing, absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "absent")) << missing.status();
  EXPECT_CODE(client_->DeleteSession("absent"), absl::StatusCode::kNotFound);
  EXPECT_CODE(client_->GetQParams("bad name!"), kInvalid);

  // Nothing listens on port 1 of loopback.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> nowhere, Client::Connect("127.0.0.1:1"));
  EXPECT_CODE(nowhere->ListCalculators(), absl::StatusCode::kUnavailable);
}

TEST_F(ClientTest, SessionLifecycle) {
  ASSERT_OK_AND_ASSIGN(v1::ListCalculatorsResponse calculators, client_->ListCalculators());
  EXPECT_GE(calculators.calculators_size(), 5);

  v1::QuantSpec spec;
  spec.set_qscheme(v1::ASYMMETRIC);
  spec.mutable_granularity()->mutable_per_channel()->set_axis(0);
  ASSERT_OK_AND_ASSIGN(v1::Session created, client_->CreateSession(CreateRequest("s", spec)));
  EXPECT_EQ(created.calculator(), "static");
  EXPECT_CODE(client_->CreateSession(CreateRequest("s")), absl::StatusCode::kAlreadyExists);

  ASSERT_OK_AND_ASSIGN(v1::Session regrained, client_->SetGranularity("s", [] {
    v1::Granularity g;
    g.mutable_per_block()->set_axis(1);
    g.mutable_per_block()->add_block_size(2);
    return g;
  }()));
  EXPECT_TRUE(regrained.spec().granularity().has_per_block());

  const Tensor x = F32({2, 4}, {1, -2, 3, 4, -5, 6, 7, 8});
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse observed, client_->Observe("s", x.view()));
  EXPECT_EQ(observed.observation_count(), 1);
  EXPECT_EQ(observed.qparams().scale_size(), 4);

  ASSERT_OK_AND_ASSIGN(v1::GetQParamsResponse cached, client_->GetQParams("s"));
  EXPECT_TRUE(cached.initialized());
  EXPECT_TRUE(MessageDifferencer::Equals(cached.qparams(), observed.qparams()));

  ASSERT_OK_AND_ASSIGN(v1::Session frozen, client_->SetExportMode("s", true));
  EXPECT_TRUE(frozen.export_mode());
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse listed, client_->ListSessions(0, "", ""));
  ASSERT_EQ(listed.sessions_size(), 1);
  EXPECT_EQ(listed.sessions(0).name(), "s");
  std::vector<v1::Session> read;
  ASSERT_OK(client_->ReadSessions("s", [&](const v1::Session& session) {
    read.push_back(session);
    return absl::OkStatus();
  }));
  ASSERT_EQ(read.size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(read[0], listed.sessions(0)));
  // The callback's error ends the stream, and is the result.
  ASSERT_OK(client_->CreateSession([] {
    v1::CreateSessionRequest r;
    r.set_name("t");
    return r;
  }()));
  int seen = 0;
  EXPECT_CODE(client_->ReadSessions("",
                                    [&](const v1::Session&) {
                                      ++seen;
                                      return absl::AbortedError("enough");
                                    }),
              absl::StatusCode::kAborted);
  EXPECT_EQ(seen, 1);
  EXPECT_CODE(
      client_->ReadSessions("bad prefix", [](const v1::Session&) { return absl::OkStatus(); }),
      absl::StatusCode::kInvalidArgument);

  EXPECT_OK(client_->DeleteSession("s"));
  EXPECT_CODE(client_->GetSession("s"), absl::StatusCode::kNotFound);
}

// An NVFP4 (compressed_tensors) session spec: one e4m3 scale per 16 values.
v1::QuantSpec Nvfp4Spec() {
  v1::QuantSpec spec;
  spec.set_dtype("float4_e2m1fn_x2");
  spec.set_scale_dtype("float8_e4m3fn");
  spec.mutable_granularity()->mutable_per_block()->set_axis(-1);
  spec.mutable_granularity()->mutable_per_block()->add_block_size(16);
  return spec;
}

v1::ScaleGroup Group(const std::string& name, const std::vector<std::string>& members,
                     v1::ScaleGroup::Share share) {
  v1::ScaleGroup group;
  group.set_name(name);
  for (const std::string& member : members) group.add_members(member);
  group.set_share(share);
  return group;
}

TEST_F(ClientTest, ScaleGroupLifecycle) {
  for (const char* name : {"{l0}.q", "{l0}.k", "{l0}.v"}) {
    v1::CreateSessionRequest request = CreateRequest(name, Nvfp4Spec());
    request.set_calculator("global_minmax");
    ASSERT_OK(client_->CreateSession(request));
  }
  std::vector<double> values(32, 0.0);
  values[3] = -7;
  values[20] = 3.5;
  ASSERT_OK(client_->Observe("{l0}.q", F32({1, 32}, values).view()));
  for (double& v : values) v /= 2;
  ASSERT_OK(client_->Observe("{l0}.k", F32({1, 32}, values).view()));

  const v1::ScaleGroup asked =
      Group("{l0}.qkv", {"{l0}.q", "{l0}.k", "{l0}.v"}, v1::ScaleGroup::GLOBAL_AMAX);
  ASSERT_OK_AND_ASSIGN(v1::ScaleGroup created, client_->CreateScaleGroup(asked));
  EXPECT_EQ(created.name(), "{l0}.qkv");
  EXPECT_EQ(created.members_size(), 3);
  EXPECT_TRUE(created.has_create_time());
  EXPECT_CODE(client_->CreateScaleGroup(asked), absl::StatusCode::kAlreadyExists);
  ASSERT_OK_AND_ASSIGN(v1::ScaleGroup got, client_->GetScaleGroup("{l0}.qkv"));
  EXPECT_TRUE(MessageDifferencer::Equals(got, created));

  // {l0}.v never saw data: the group waits for it.
  ASSERT_OK_AND_ASSIGN(v1::GroupQParams waiting, client_->GetGroupQParams("{l0}.qkv"));
  EXPECT_FALSE(waiting.initialized());
  ASSERT_EQ(waiting.uncalibrated_size(), 1);
  EXPECT_EQ(waiting.uncalibrated(0), "{l0}.v");

  // Filled, the largest member's qparams are its own; the other takes its scale.
  v1::ScaleGroup filled =
      Group("{l0}.qk", {"{l0}.q", "{l0}.k", "{l0}.v"}, v1::ScaleGroup::GLOBAL_AMAX);
  filled.set_fill_uncalibrated(true);
  ASSERT_OK(client_->CreateScaleGroup(filled));
  ASSERT_OK_AND_ASSIGN(v1::GroupQParams result, client_->GetGroupQParams("{l0}.qk"));
  EXPECT_TRUE(result.initialized());
  EXPECT_EQ(result.amax(), 7.0f);
  ASSERT_EQ(result.members_size(), 3);
  ASSERT_OK_AND_ASSIGN(v1::GetQParamsResponse q, client_->GetQParams("{l0}.q"));
  EXPECT_TRUE(MessageDifferencer::Equals(result.members(0).qparams(), q.qparams()));
  EXPECT_EQ(result.members(0).amax(), 7.0f);
  EXPECT_EQ(result.members(1).amax(), 3.5f);
  EXPECT_EQ(result.members(1).qparams().global_scale(), result.global_scale());
  EXPECT_EQ(result.members(1).qparams().scale_e4m3().size(), 2u);
  EXPECT_FALSE(result.members(2).has_amax());
  EXPECT_EQ(result.members(2).qparams().global_scale(), result.global_scale());

  // One page, and every page.
  ASSERT_OK(client_->CreateScaleGroup(Group("other", {"{l0}.q"}, v1::ScaleGroup::GLOBAL_AMAX)));
  ASSERT_OK_AND_ASSIGN(v1::ListScaleGroupsResponse page, client_->ListScaleGroups(1, "", "{l0}"));
  ASSERT_EQ(page.groups_size(), 1);
  EXPECT_EQ(page.groups(0).name(), "{l0}.qk");
  EXPECT_NE(page.next_page_token(), "");
  std::vector<std::string> names;
  ASSERT_OK(client_->ReadScaleGroups("{l0}", 1, [&names](const v1::ScaleGroup& group) {
    names.push_back(group.name());
    return absl::OkStatus();
  }));
  EXPECT_EQ(names, (std::vector<std::string>{"{l0}.qk", "{l0}.qkv"}));
  names.clear();
  ASSERT_OK(client_->ReadScaleGroups("", 0, [&names](const v1::ScaleGroup& group) {
    names.push_back(group.name());
    return absl::OkStatus();
  }));
  EXPECT_EQ(names, (std::vector<std::string>{"other", "{l0}.qk", "{l0}.qkv"}));
  // The callback's error ends it, and is the result.
  int seen = 0;
  EXPECT_CODE(client_->ReadScaleGroups("", 1,
                                       [&seen](const v1::ScaleGroup&) {
                                         ++seen;
                                         return absl::AbortedError("enough");
                                       }),
              absl::StatusCode::kAborted);
  EXPECT_EQ(seen, 1);

  // Deleting a group keeps its members.
  EXPECT_OK(client_->DeleteScaleGroup("{l0}.qkv"));
  EXPECT_CODE(client_->GetScaleGroup("{l0}.qkv"), absl::StatusCode::kNotFound);
  EXPECT_OK(client_->GetSession("{l0}.v"));
}

TEST_F(ClientTest, ScaleGroupCallsCarryTheServersErrors) {
  ASSERT_OK(client_->CreateSession(CreateRequest("m")));
  const absl::StatusOr<v1::GroupQParams> missing = client_->GetGroupQParams("absent");
  EXPECT_CODE(missing, absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "absent")) << missing.status();
  EXPECT_CODE(client_->GetScaleGroup("absent"), absl::StatusCode::kNotFound);
  EXPECT_CODE(client_->DeleteScaleGroup("absent"), absl::StatusCode::kNotFound);
  EXPECT_CODE(client_->CreateScaleGroup(Group("g", {}, v1::ScaleGroup::UNION_RANGE)), kInvalid);
  EXPECT_CODE(client_->CreateScaleGroup(Group("g", {"m"}, v1::ScaleGroup::SHARE_UNSPECIFIED)),
              kInvalid);
  EXPECT_CODE(client_->CreateScaleGroup(Group("g", {"m", "nope"}, v1::ScaleGroup::UNION_RANGE)),
              absl::StatusCode::kNotFound);
  // An int8 member has no e4m3 scales to share a global scale of.
  EXPECT_CODE(client_->CreateScaleGroup(Group("g", {"m"}, v1::ScaleGroup::GLOBAL_AMAX)), kInvalid);
  EXPECT_CODE(client_->ListScaleGroups(-1, "", ""), kInvalid);
  EXPECT_CODE(client_->ReadScaleGroups("bad prefix", 0,
                                       [](const v1::ScaleGroup&) { return absl::OkStatus(); }),
              kInvalid);
}

// The x-qparams-session header of each call it receives, refusing the call.
class HeaderRecorder final : public v1::QParamsService::Service {
 public:
  std::vector<std::pair<std::string, std::string>> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

  grpc::Status CreateScaleGroup(grpc::ServerContext* context, const v1::CreateScaleGroupRequest*,
                                v1::ScaleGroup*) override {
    return Record("CreateScaleGroup", *context);
  }
  grpc::Status GetScaleGroup(grpc::ServerContext* context, const v1::GetScaleGroupRequest*,
                             v1::ScaleGroup*) override {
    return Record("GetScaleGroup", *context);
  }
  grpc::Status ListScaleGroups(grpc::ServerContext* context, const v1::ListScaleGroupsRequest*,
                               v1::ListScaleGroupsResponse*) override {
    return Record("ListScaleGroups", *context);
  }
  grpc::Status DeleteScaleGroup(grpc::ServerContext* context, const v1::DeleteScaleGroupRequest*,
                                v1::DeleteScaleGroupResponse*) override {
    return Record("DeleteScaleGroup", *context);
  }
  grpc::Status GetGroupQParams(grpc::ServerContext* context, const v1::GetGroupQParamsRequest*,
                               v1::GroupQParams*) override {
    return Record("GetGroupQParams", *context);
  }
  grpc::Status GetSession(grpc::ServerContext* context, const v1::GetSessionRequest*,
                          v1::Session*) override {
    return Record("GetSession", *context);
  }

 private:
  grpc::Status Record(const std::string& method, const grpc::ServerContext& context) {
    const auto& metadata = context.client_metadata();
    const auto header = metadata.find(kSessionHeader);
    absl::MutexLock lock(&mu_);
    seen_.emplace_back(method, header == metadata.end()
                                   ? "(none)"
                                   : std::string(header->second.data(), header->second.size()));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "recorded");
  }

  absl::Mutex mu_;
  std::vector<std::pair<std::string, std::string>> seen_ ABSL_GUARDED_BY(mu_);
};

// A group routes as a session does: the header carries the name's hash tag only
// (what HAProxy hashes), or the whole name without one; a listing names none.
TEST(ScaleGroupRoutingTest, CallsCarryTheHashedPartOfTheGroupName) {
  HeaderRecorder recorder;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&recorder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(absl::StrCat("127.0.0.1:", port)));
  const absl::StatusCode unavailable = absl::StatusCode::kUnavailable;
  EXPECT_CODE(client->CreateScaleGroup(
                  Group("{layer0}.qkv", {"{layer0}.q_proj"}, v1::ScaleGroup::GLOBAL_AMAX)),
              unavailable);
  EXPECT_CODE(client->GetScaleGroup("{layer0}.qkv"), unavailable);
  EXPECT_CODE(client->DeleteScaleGroup("w/{layer0}.gate_up"), unavailable);
  EXPECT_CODE(client->GetGroupQParams("{layer0}.qkv"), unavailable);
  EXPECT_CODE(client->GetGroupQParams("plain.group"), unavailable);
  EXPECT_CODE(client->ListScaleGroups(0, "", "{layer0}"), unavailable);
  EXPECT_CODE(client->GetSession("{layer0}.q_proj"), unavailable);  // the same rule
  server->Shutdown();
  EXPECT_EQ(recorder.seen(),
            (std::vector<std::pair<std::string, std::string>>{{"CreateScaleGroup", "layer0"},
                                                              {"GetScaleGroup", "layer0"},
                                                              {"DeleteScaleGroup", "layer0"},
                                                              {"GetGroupQParams", "layer0"},
                                                              {"GetGroupQParams", "plain.group"},
                                                              {"ListScaleGroups", "(none)"},
                                                              {"GetSession", "layer0"}}));
}

// A range observation reduced with the core gives what the tensor gives.
TEST_F(ClientTest, ObserveRangeMatchesObserve) {
  v1::QuantSpec spec;
  spec.mutable_granularity()->mutable_per_channel()->set_axis(-1);
  ASSERT_OK(client_->CreateSession(CreateRequest("tensor", spec)));
  ASSERT_OK(client_->CreateSession(CreateRequest("range", spec)));
  const Tensor x = MakeTensor(DType::kBFloat16, {8, 3}, RandN(24, 7));
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse by_tensor, client_->Observe("tensor", x.view()));
  ASSERT_OK_AND_ASSIGN(BlockRange range, ObserveRange(x.view(), {8, 1}));
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse by_range,
                       client_->ObserveRange("range", x.shape, range.min.view(), range.max.view()));
  EXPECT_TRUE(MessageDifferencer::Equals(by_tensor, by_range));
  EXPECT_EQ(by_range.qparams().precision(), v1::BFLOAT16);
}

// Many requests, some refused: one response each, in order, the stream unharmed.
// Per-element blocks make the responses as large as the requests, so the stream
// completes only if responses are read while requests are still being written.
TEST_F(ClientTest, ObserveStreamAnswersEveryRequestInOrder) {
  v1::QuantSpec spec;
  spec.mutable_granularity()->mutable_per_block()->add_block_size(1);
  spec.mutable_granularity()->mutable_per_block()->add_block_size(1);
  ASSERT_OK(client_->CreateSession(CreateRequest("big", spec)));
  std::vector<double> values = RandN(256 * 256, 11);
  const Tensor x = F32({256, 256}, values);
  values[5] = NAN;
  const Tensor nan = F32({256, 256}, values);
  std::vector<v1::ObserveRequest> requests;
  for (int i = 0; i < 40; ++i) {
    requests.push_back(i % 10 == 9 ? TensorObservation("big", nan.view())
                                   : TensorObservation("big", x.view()));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ObserveResponse> responses,
                       client_->ObserveStream(requests));
  ASSERT_EQ(responses.size(), requests.size());
  int64_t count = 0;
  for (int i = 0; i < 40; ++i) {
    SCOPED_TRACE(i);
    if (i % 10 == 9) {
      EXPECT_EQ(responses[i].status().code(), static_cast<int>(kInvalid));
    } else {
      EXPECT_EQ(responses[i].status().code(), 0) << responses[i].status().message();
      EXPECT_EQ(responses[i].qparams().scale_size(), 256 * 256);
      ++count;
    }
    EXPECT_EQ(responses[i].observation_count(), count);
  }
}

TEST_F(ClientTest, ObserveStreamSendsNothingIfARequestIsTooLarge) {
  ClientOptions small;
  small.max_message_bytes = 1024;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address(), small));
  ASSERT_OK(client->CreateSession(CreateRequest("s")));
  const Tensor fits = F32({4}, {1, 2, 3, 4});
  const Tensor too_large = F32({512}, RandN(512, 3));
  EXPECT_CODE(client->ObserveStream(
                  {TensorObservation("s", fits.view()), TensorObservation("s", too_large.view())}),
              absl::StatusCode::kResourceExhausted);
  ASSERT_OK_AND_ASSIGN(v1::Session session, client->GetSession("s"));
  EXPECT_EQ(session.observation_count(), 0);
}

TEST_F(ClientTest, ObserveBatchAnswersEveryRequestInOrderAndTooLargeAppliesNothing) {
  ASSERT_OK(client_->CreateSession(CreateRequest("s")));
  const Tensor x = F32({4}, {1, -2, 3, 4});
  const Tensor nan = F32({2}, {1, NAN});
  ASSERT_OK_AND_ASSIGN(
      std::vector<v1::ObserveResponse> responses,
      client_->ObserveBatch({TensorObservation("s", x.view()), TensorObservation("s", nan.view()),
                             TensorObservation("s", x.view())}));
  ASSERT_EQ(responses.size(), 3u);
  EXPECT_EQ(responses[0].status().code(), 0);
  EXPECT_EQ(responses[1].status().code(), static_cast<int>(kInvalid));
  EXPECT_EQ(responses[2].status().code(), 0);
  EXPECT_EQ(responses[2].observation_count(), 2);

  ClientOptions small;
  small.max_message_bytes = 1024;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address(), small));
  const Tensor too_large = F32({512}, RandN(512, 3));
  EXPECT_CODE(client->ObserveBatch(
                  {TensorObservation("s", x.view()), TensorObservation("s", too_large.view())}),
              absl::StatusCode::kResourceExhausted);
  ASSERT_OK_AND_ASSIGN(v1::Session session, client->GetSession("s"));
  EXPECT_EQ(session.observation_count(), 2);
}

TEST_F(ClientTest, Health) {
  ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus server, client_->Health());
  EXPECT_EQ(server, HealthCheckResponse::SERVING);
  ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus service,
                       client_->Health("qparams.v1.QParamsService"));
  EXPECT_EQ(service, HealthCheckResponse::SERVING);
  EXPECT_CODE(client_->Health("no.such.Service"), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace qparams::testing
