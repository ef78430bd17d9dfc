// Safe retries of observations end to end (docs/retries.md): the C++ client's keys
// and retries against a server whose answer is lost after it applied the
// observation (tests/support/cutting_proxy.h), and a server restarted between an
// observation and its retry.

#include <stdlib.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "qparams/client.h"
#include "tests/support/cutting_proxy.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

class RetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    proxy_ = CuttingProxy::Start(server_->address());
    ASSERT_NE(proxy_, nullptr);
    ClientOptions options;
    options.retry_initial_backoff = absl::Milliseconds(5);
    ASSERT_OK_AND_ASSIGN(proxied_, Client::Connect(proxy_->address(), options));
    ASSERT_OK_AND_ASSIGN(direct_, Client::Connect(server_->address()));
    v1::CreateSessionRequest create;
    create.set_name("ma");
    create.set_calculator("moving_average");
    ASSERT_OK(direct_->CreateSession(create));
    // The proxied client's connection is up, and its batches' topology read
    // (GetTopology), before answers are dropped.
    ASSERT_OK(proxied_->ObserveBatch({TensorObservation("ma", Vec({-1, 1}).view())}));
  }

  int64_t Count() { return direct_->GetSession("ma")->observation_count(); }

  // Waits until the server has applied `count` observations of "ma" (it answers
  // through the proxy, which drops the answer), then cuts the connection.
  void CutOnceApplied(int64_t count) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (Count() < count && absl::Now() < deadline) std::this_thread::yield();
    ASSERT_EQ(Count(), count);
    proxy_->Cut();
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<CuttingProxy> proxy_;
  std::unique_ptr<Client> proxied_;
  std::unique_ptr<Client> direct_;
};

TEST_F(RetryTest, AnObservationWhoseAnswerIsLostIsRetriedAndAppliedOnce) {
  const v1::Session before = *direct_->GetSession("ma");
  proxy_->DropAnswers();
  absl::StatusOr<v1::ObserveResponse> response;
  std::thread call([&] { response = proxied_->Observe("ma", Vec({-4, 8}).view()); });
  CutOnceApplied(2);
  call.join();
  ASSERT_OK(response);
  EXPECT_TRUE(response->duplicate());
  EXPECT_EQ(response->observation_count(), 2);
  EXPECT_EQ(Count(), 2);
  // The retry's qparams are the session's, which one application left.
  EXPECT_EQ(response->qparams().SerializeAsString(),
            direct_->GetQParams("ma")->qparams().SerializeAsString());
  EXPECT_NE(before.running_max(0), direct_->GetSession("ma")->running_max(0));
  // The next observation is a new key.
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse next, proxied_->Observe("ma", Vec({0, 1}).view()));
  EXPECT_FALSE(next.duplicate());
  EXPECT_EQ(next.observation_count(), 3);
}

TEST_F(RetryTest, ABatchWhoseAnswerIsLostIsRetriedAndEachItemAppliedOnce) {
  proxy_->DropAnswers();
  absl::StatusOr<std::vector<v1::ObserveResponse>> responses;
  std::thread call([&] {
    responses = proxied_->ObserveBatch(
        {TensorObservation("ma", Vec({-2, 2}).view()), TensorObservation("ma", Vec({-3, 3}).view())});
  });
  CutOnceApplied(3);
  call.join();
  ASSERT_OK(responses);
  ASSERT_EQ(responses->size(), 2u);
  EXPECT_TRUE((*responses)[0].duplicate());
  EXPECT_EQ((*responses)[0].observation_count(), 2);
  EXPECT_EQ((*responses)[1].observation_count(), 3);
  EXPECT_EQ(Count(), 3);
}

TEST_F(RetryTest, AStreamCutAfterItsObservationsAppliedIsRetriedOnce) {
  proxy_->DropAnswers();
  absl::StatusOr<std::vector<v1::ObserveResponse>> responses;
  std::thread call([&] {
    responses = proxied_->ObserveStream(
        {TensorObservation("ma", Vec({-2, 2}).view()), TensorObservation("ma", Vec({-3, 3}).view())});
  });
  CutOnceApplied(3);
  call.join();
  ASSERT_OK(responses);
  ASSERT_EQ(responses->size(), 2u);
  EXPECT_TRUE((*responses)[1].duplicate());
  EXPECT_EQ((*responses)[1].observation_count(), 3);
  EXPECT_EQ(Count(), 3);
}

TEST_F(RetryTest, WithoutKeysALostAnswerIsNotRetried) {
  ClientOptions options;
  options.idempotency_keys = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> unkeyed, Client::Connect(proxy_->address(), options));
  ASSERT_OK(unkeyed->Observe("ma", Vec({-1, 1}).view()));
  proxy_->DropAnswers();
  absl::StatusOr<v1::ObserveResponse> response;
  std::thread call([&] { response = unkeyed->Observe("ma", Vec({-4, 8}).view()); });
  CutOnceApplied(3);
  call.join();
  EXPECT_CODE(response, absl::StatusCode::kUnavailable);
  EXPECT_EQ(Count(), 3);
}

// Each thread keys under an id of its own (client_id, then client_id.1, ...) with
// sequences of its own, so that threads sharing a client never race each other's
// sequences out of the window (docs/retries.md). Shown through the server's rule: a
// key sent before by someone else is a duplicate.
TEST_F(RetryTest, EachThreadKeysUnderAnIdOfItsOwn) {
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse first, direct_->Observe("ma", Vec({-1, 1}).view()));
  const int64_t count = first.observation_count();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address()));
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse own, client->Observe("ma", Vec({-1, 1}).view()));
  EXPECT_FALSE(own.duplicate());
  // The key the client's second thread will send first, sent by another client.
  v1::ObserveRequest taken = TensorObservation("ma", Vec({-1, 1}).view());
  taken.set_client_id(client->client_id() + ".1");
  taken.set_sequence(1);
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse applied, direct_->Observe(taken));
  EXPECT_FALSE(applied.duplicate());
  absl::StatusOr<v1::ObserveResponse> second;
  std::thread([&] { second = client->Observe("ma", Vec({-1, 1}).view()); }).join();
  ASSERT_OK(second);
  EXPECT_TRUE(second->duplicate());
  EXPECT_EQ(second->observation_count(), count + 2);
  // The first thread's next key (client_id, 2) is new.
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse next, client->Observe("ma", Vec({-1, 1}).view()));
  EXPECT_FALSE(next.duplicate());
  EXPECT_EQ(next.observation_count(), count + 3);
}

// Many threads on one client and one session: every observation applied once.
TEST_F(RetryTest, ThreadsSharingAClientAreEachAppliedOnce) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address()));
  const int64_t before = Count();
  constexpr int kThreads = 8, kEach = 40;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<v1::ObserveResponse> r = client->Observe("ma", Vec({-1, float(i)}).view());
        if (!r.ok() || r->duplicate()) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<int>(kThreads, 0));
  EXPECT_EQ(Count(), before + kThreads * kEach);
}

TEST(RetryOptions, RetriesEndWithinTheTotalTime) {
  ClientOptions options;
  options.timeout = absl::Seconds(2);
  options.retry_total = absl::Milliseconds(300);
  options.retry_initial_backoff = absl::Milliseconds(10);
  // A port nobody listens on: each attempt fails at once with UNAVAILABLE.
  std::unique_ptr<TestServer> gone = TestServer::Start();
  ASSERT_NE(gone, nullptr);
  const std::string address = gone->address();
  gone.reset();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(address, options));
  const absl::Time start = absl::Now();
  EXPECT_CODE(client->Observe("ma", Vec({1}).view()), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  options.retry_initial_backoff = absl::ZeroDuration();
  EXPECT_CODE(Client::Connect(address, options), kInvalid);
  options.retry_initial_backoff = absl::Seconds(2);
  options.retry_max_backoff = absl::Seconds(1);
  EXPECT_CODE(Client::Connect(address, options), kInvalid);
  options.retry_max_backoff = absl::Seconds(2);
  options.retry_total = absl::Seconds(-1);
  EXPECT_CODE(Client::Connect(address, options), kInvalid);
}

TEST(RetryRestart, ARetryAfterARestartIsAnsweredAsADuplicate) {
  char pattern[] = "/tmp/qparams-retry-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ServerOptions server_options;
  server_options.data_dir = dir;
  server_options.durability = Durability::kAlways;
  // The same key twice, as a client retrying across the restart sends it.
  v1::ObserveRequest request = TensorObservation("ma", Vec({-4, 8}).view());
  request.set_client_id("restart-test");
  request.set_sequence(1);
  {
    std::unique_ptr<TestServer> server = TestServer::Start(server_options);
    ASSERT_NE(server, nullptr);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server->address()));
    v1::CreateSessionRequest create;
    create.set_name("ma");
    create.set_calculator("moving_average");
    ASSERT_OK(client->CreateSession(create));
    ASSERT_OK_AND_ASSIGN(v1::ObserveResponse first, client->Observe(request));
    EXPECT_FALSE(first.duplicate());
    EXPECT_EQ(first.observation_count(), 1);
  }
  std::unique_ptr<TestServer> server = TestServer::Start(server_options);
  ASSERT_NE(server, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server->address()));
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse retry, client->Observe(request));
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(retry.observation_count(), 1);
  EXPECT_EQ(client->GetSession("ma")->observation_count(), 1);
  // The client's own keys are another client's: applied.
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse own, client->Observe("ma", Vec({-4, 8}).view()));
  EXPECT_FALSE(own.duplicate());
  EXPECT_EQ(own.observation_count(), 2);
  server.reset();
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

}  // namespace
}  // namespace qparams::testing
