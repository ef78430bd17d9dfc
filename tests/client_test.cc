// qparams::Client against an in-process server: typed calls, status codes and
// messages carried over, tensors encoded for the caller, and ObserveStream.

#include "client/client.h"

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
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/service_test_util.h"
#include "tests/test_util.h"

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
