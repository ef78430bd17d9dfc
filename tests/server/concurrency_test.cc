// Sessions under concurrent load: observations of one session apply one at a time
// and end in exactly the serial state; different sessions do not wait for each other.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

TEST(Concurrency, SixteenClientsOnOneSessionEndInTheSerialState) {
  constexpr int kThreads = 16, kPerThread = 200;
  std::unique_ptr<TestServer> server = TestServer::Start();
  ASSERT_NE(server, nullptr);
  v1::QuantSpec spec;
  spec.set_qscheme(v1::ASYMMETRIC);
  spec.mutable_granularity()->mutable_per_channel()->set_axis(0);
  {
    auto stub = server->NewStub();
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_name("shared");
    request.set_calculator("global_minmax");
    *request.mutable_spec() = spec;
    v1::Session session;
    ASSERT_TRUE(stub->CreateSession(&context, request, &session).ok());
  }
  auto input = [](int thread, int i) {
    return F32({4, 8}, RandN(32, 1000 * thread + i, 1.0 + thread));
  };

  std::atomic<int> failures{0};
  std::string first_failure;  // written by the thread that counts the first failure
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = server->NewStub();
      for (int i = 0; i < kPerThread; ++i) {
        grpc::ClientContext context;
        // 16 connections open at once on a loaded 2-core machine: wait for the
        // connection rather than fail fast, since connecting is not under test here.
        context.set_wait_for_ready(true);
        v1::ObserveRequest request;
        request.set_name("shared");
        *request.mutable_tensor() = wire::TensorToProto(input(t, i).view());
        v1::ObserveResponse response;
        const grpc::Status status = stub->Observe(&context, request, &response);
        if (!status.ok() && failures++ == 0) {
          first_failure = absl::StrCat(status.error_code(), ": ", status.error_message());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures, 0) << "first failure: " << first_failure;

  // The same observations applied serially in the core.
  ASSERT_OK_AND_ASSIGN(auto serial, Create("global_minmax", *wire::SpecFromProto(spec)));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) ASSERT_OK(Fwd(*serial, input(t, i)));
  }
  auto stub = server->NewStub();
  grpc::ClientContext context;
  v1::GetSessionRequest get;
  get.set_name("shared");
  v1::Session session;
  ASSERT_TRUE(stub->GetSession(&context, get, &session).ok());
  EXPECT_EQ(session.observation_count(), kThreads * kPerThread);
  auto* running = AsRunning(serial.get());
  EXPECT_TRUE(wire::QParamsFromProto(session.qparams()) == AsStateful(serial.get())->GetQParams());
  ASSERT_EQ(session.running_min_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(session.running_min(i), static_cast<float>(running->running_range().lo[i]));
    EXPECT_EQ(session.running_max(i), static_cast<float>(running->running_range().hi[i]));
  }
}

// A stateful calculator whose computing forwards wait for a notification, so a test
// can hold one session in the middle of an observation.
absl::Notification* forward_started = nullptr;
absl::Notification* release_forward = nullptr;

class BlockingCalculator final : public StatefulQParamsCalculatorBase {
 public:
  explicit BlockingCalculator(QuantSpec spec) : StatefulQParamsCalculatorBase(std::move(spec)) {}
  absl::string_view key() const override { return "test_blocking"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override {
    return std::make_unique<BlockingCalculator>(*this);
  }

 protected:
  QParams ComputeQParams(const WorkingRange& range) override {
    forward_started->Notify();
    release_forward->WaitForNotification();
    return QParamsFromRange(recipe_, range);
  }
};

TEST(Concurrency, ASessionMidObservationBlocksNoOtherSession) {
  absl::Notification started, release;
  forward_started = &started;
  release_forward = &release;
  QParamsCalculatorRegistry::Global().Register(
      StatefulClass("test_blocking", "waits for the test",
                    [](const QuantSpec& spec, const CalculatorOptions&)
                        -> absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> {
                      return std::make_unique<BlockingCalculator>(spec);
                    }));
  std::unique_ptr<TestServer> server = TestServer::Start();
  ASSERT_NE(server, nullptr);
  Engine& engine = server->server().engine();
  ASSERT_OK(engine.CreateSession("", "held", "test_blocking", QuantSpec{}, {}));
  ASSERT_OK(engine.CreateSession("", "free", "static", QuantSpec{}, {}));

  std::thread held([&] {
    auto stub = server->NewStub();
    grpc::ClientContext context;
    v1::ObserveRequest request;
    request.set_name("held");
    *request.mutable_tensor() = wire::TensorToProto(Vec({1, 2}).view());
    v1::ObserveResponse response;
    EXPECT_TRUE(stub->Observe(&context, request, &response).ok());
    EXPECT_EQ(response.observation_count(), 1);
  });
  started.WaitForNotification();

  // While "held" is mid-forward, every call on other sessions completes (a deadline
  // turns a would-be deadlock into a failure).
  auto stub = server->NewStub();
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::ObserveRequest request;
    request.set_name("free");
    *request.mutable_tensor() = wire::TensorToProto(Vec({1.0 * i, -2}).view());
    v1::ObserveResponse response;
    ASSERT_TRUE(stub->Observe(&context, request, &response).ok());
  }
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::CreateSessionRequest request;
    request.set_name("new");
    v1::Session session;
    ASSERT_TRUE(stub->CreateSession(&context, request, &session).ok());
  }
  release.Notify();
  held.join();
  ASSERT_OK_AND_ASSIGN(SessionInfo info, engine.GetSession("", "held"));
  EXPECT_EQ(info.observation_count, 1);
}

}  // namespace
}  // namespace qparams::testing
