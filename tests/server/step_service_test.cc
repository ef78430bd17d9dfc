// The Step and ResumeSteps RPCs (docs/qat.md): the worked example of qat.md §7 over
// the wire with every rank reading the same bits, reads that wait without holding a
// server thread, a deadline, a checkpoint and its resume replaying bit-identically,
// bad contributions named and changing nothing, and a session's progress.

#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/server/service_test_util.h"

namespace qparams::testing {
namespace {

using grpc::StatusCode;

class StepService : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
  }

  void Create(const std::string& name) {
    v1::CreateSessionRequest request;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        absl::StrCat("name: '", name,
                     "' calculator: 'moving_average' averaging_constant: 0.5 "
                     "spec { dtype: 'int8' qscheme: ASYMMETRIC granularity { per_tensor {} } }"),
        &request));
    grpc::ClientContext context;
    v1::Session session;
    ASSERT_TRUE(stub_->CreateSession(&context, request, &session).ok());
  }

  // A float32 tensor of `values` (shape {n}).
  static v1::Tensor Floats(const std::vector<float>& values) {
    v1::Tensor t;
    t.set_dtype(v1::FLOAT32);
    t.add_shape(static_cast<int64_t>(values.size()));
    t.set_data(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    return t;
  }

  struct Call {
    grpc::Status status;
    v1::StepResponse response;
  };
  // Rank `rank` of `world` contributes `values` (empty: nothing) to step `step` of
  // `name` and reads as of `read` (if >= 0), within `deadline`.
  Call StepCall(v1::QParamsService::Stub& stub, const std::string& name, int64_t step, int32_t rank,
                int32_t world, const std::vector<float>& values, int64_t read,
                absl::Duration deadline = absl::Seconds(30), bool checkpoint = false) {
    v1::StepRequest request;
    request.set_rank(rank);
    request.set_world_size(world);
    if (step >= 0) {
      v1::StepContribution* c = request.add_contributions();
      c->set_name(name);
      c->set_step(step);
      if (!values.empty()) *c->mutable_tensor() = Floats(values);
    }
    if (read >= 0) {
      v1::StepRead* r = request.add_reads();
      r->set_name(name);
      r->set_step(read);
      r->set_checkpoint(checkpoint);
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    Call call;
    call.status = stub.Step(&context, request, &call.response);
    return call;
  }

  v1::Session Get(const std::string& name) {
    grpc::ClientContext context;
    v1::GetSessionRequest request;
    request.set_name(name);
    v1::Session session;
    EXPECT_TRUE(stub_->GetSession(&context, request, &session).ok());
    return session;
  }

  static bool Same(const google::protobuf::Message& a, const google::protobuf::Message& b) {
    return google::protobuf::util::MessageDifferencer::Equals(a, b);
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
};

// qat.md §7 with both ranks' reads in their own calls: rank 1's read of each step
// waits for rank 0's contribution, and both read the same bits.
TEST_F(StepService, WorkedExampleEveryRankReadsTheSameBits) {
  Create("qat/a");
  const std::vector<std::vector<float>> rank0 = {{-1, 2}, {-1, 4}, {0.5, 2}};
  const std::vector<std::vector<float>> rank1 = {{-3, 1}, {}, {-2, 6}};
  const std::vector<std::pair<float, float>> running = {{-3, 2}, {-2, 3}, {-2, 4.5}};
  for (int64_t step = 0; step < 3; ++step) {
    Call late;
    std::thread waiter([&] {
      auto stub = server_->NewStub();
      late = StepCall(*stub, "qat/a", step, 1, 2, rank1[step], step);
    });
    const Call first = StepCall(*stub_, "qat/a", step, 0, 2, rank0[step], step);
    waiter.join();
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    ASSERT_TRUE(late.status.ok()) << late.status.error_message();
    ASSERT_EQ(first.response.reads_size(), 1);
    EXPECT_EQ(first.response.reads(0).status().code(), 0)
        << first.response.reads(0).status().message();
    EXPECT_EQ(first.response.reads(0).step(), step);
    EXPECT_TRUE(first.response.reads(0).initialized());
    EXPECT_TRUE(Same(first.response.reads(0), late.response.reads(0)));
    const v1::Session session = Get("qat/a");
    EXPECT_EQ(session.running_min(0), running[step].first) << step;
    EXPECT_EQ(session.running_max(0), running[step].second) << step;
    EXPECT_EQ(session.steps().last_applied_step(), step);
    EXPECT_TRUE(Same(session.qparams(), first.response.reads(0).qparams()));
  }
}

// Many reads waiting at once hold no server thread: more calls wait than the
// callback server has threads, and one contribution answers them all.
TEST_F(StepService, WaitingReadsHoldNoThread) {
  Create("qat/w");
  constexpr int kWaiting = 300;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::StepResponse> responses(kWaiting);
  std::vector<grpc::Status> statuses(kWaiting);
  std::shared_ptr<grpc::Channel> channel = server_->NewChannel();
  auto stub = v1::QParamsService::NewStub(channel);
  absl::Mutex mu;
  absl::CondVar answered;
  int done = 0;
  v1::StepRequest read;
  read.set_rank(0);
  read.set_world_size(2);
  read.add_reads()->set_name("qat/w");
  for (int i = 0; i < kWaiting; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    stub->async()->Step(contexts.back().get(), &read, &responses[i], [&, i](grpc::Status s) {
      absl::MutexLock lock(&mu);
      statuses[i] = std::move(s);
      ++done;
      answered.Signal();
    });
  }
  // The server still answers other calls, then both ranks complete step 0.
  EXPECT_TRUE(Get("qat/w").name() == "qat/w");
  ASSERT_TRUE(StepCall(*stub_, "qat/w", 0, 0, 2, {1, 2}, -1).status.ok());
  ASSERT_TRUE(StepCall(*stub_, "qat/w", 0, 1, 2, {-1, 3}, -1).status.ok());
  {
    absl::MutexLock lock(&mu);
    // A CondVar loop, not Mutex::Await (storage/journal_reader.cc says why).
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (done < kWaiting && !answered.WaitWithDeadline(&mu, deadline)) {
    }
    ASSERT_EQ(done, kWaiting);
  }
  for (int i = 0; i < kWaiting; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    EXPECT_EQ(responses[i].reads(0).step(), 0);
    EXPECT_TRUE(Same(responses[i].reads(0), responses[0].reads(0)));
  }
}

TEST_F(StepService, AReadOfAStepNotAppliedEndsAtItsDeadline) {
  Create("qat/d");
  ASSERT_TRUE(StepCall(*stub_, "qat/d", 0, 0, 2, {1, 2}, -1).status.ok());
  const Call call = StepCall(*stub_, "qat/d", -1, 0, 2, {}, 0, absl::Milliseconds(200));
  EXPECT_EQ(call.status.error_code(), StatusCode::DEADLINE_EXCEEDED);
  const v1::Session session = Get("qat/d");  // still served, nothing changed
  EXPECT_EQ(session.steps().last_applied_step(), -1);
  ASSERT_EQ(session.steps().pending_size(), 1);
  EXPECT_EQ(session.steps().pending(0).missing_ranks(0), 1);
}

// qat.md §6: a job restarted from its checkpoint of step 1 replays steps 2 and 3 and
// reads the bits the uninterrupted run read.
TEST_F(StepService, ResumeFromACheckpointReplaysBitIdentically) {
  Create("qat/r");
  const std::vector<std::vector<float>> batches = {{-1, 2}, {-3, 5}, {0.25, 7}, {-9, 1}};
  std::vector<v1::StepReadResult> uninterrupted;
  std::string checkpoint;
  for (int64_t step = 0; step < 4; ++step) {
    const Call call = StepCall(*stub_, "qat/r", step, 0, 1, batches[step], step, absl::Seconds(30),
                               /*checkpoint=*/step == 1);
    ASSERT_TRUE(call.status.ok());
    ASSERT_EQ(call.response.reads(0).status().code(), 0)
        << call.response.reads(0).status().message();
    if (step == 1) checkpoint = call.response.reads(0).checkpoint();
    uninterrupted.push_back(call.response.reads(0));
  }
  ASSERT_FALSE(checkpoint.empty());
  // A checkpoint is only of the last applied step.
  const Call old = StepCall(*stub_, "qat/r", -1, 0, 1, {}, 1, absl::Seconds(30), true);
  EXPECT_EQ(old.response.reads(0).status().code(),
            static_cast<int>(StatusCode::FAILED_PRECONDITION));

  v1::ResumeStepsRequest resume;
  v1::ResumeItem* item = resume.add_items();
  item->set_name("qat/r");
  item->set_next_step(2);
  item->set_checkpoint(checkpoint);
  {
    grpc::ClientContext context;
    v1::ResumeStepsResponse response;
    ASSERT_TRUE(stub_->ResumeSteps(&context, resume, &response).ok());
    ASSERT_EQ(response.statuses(0).code(), 0) << response.statuses(0).message();
  }
  EXPECT_EQ(Get("qat/r").steps().last_applied_step(), 1);
  for (int64_t step = 2; step < 4; ++step) {
    const Call call = StepCall(*stub_, "qat/r", step, 0, 1, batches[step], step);
    ASSERT_TRUE(call.status.ok());
    uninterrupted[step].clear_checkpoint();
    EXPECT_TRUE(Same(call.response.reads(0), uninterrupted[step])) << step;
    EXPECT_FALSE(call.response.contributions(0).duplicate());
  }
  // Bytes that are no checkpoint, and another session's, are refused.
  Create("qat/other");
  item->set_checkpoint("not a checkpoint");
  item->set_name("qat/r");
  grpc::ClientContext c1;
  v1::ResumeStepsResponse r1;
  ASSERT_TRUE(stub_->ResumeSteps(&c1, resume, &r1).ok());
  EXPECT_EQ(r1.statuses(0).code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StrContains(r1.statuses(0).message(), "checkpoint"))
      << r1.statuses(0).message();
  item->set_name("qat/other");
  item->set_checkpoint(checkpoint);
  grpc::ClientContext c2;
  v1::ResumeStepsResponse r2;
  ASSERT_TRUE(stub_->ResumeSteps(&c2, resume, &r2).ok());
  EXPECT_EQ(r2.statuses(0).code(), static_cast<int>(StatusCode::FAILED_PRECONDITION));
  EXPECT_EQ(Get("qat/r").steps().last_applied_step(), 3);
}

// qat.md §6: each refused with the field named, nothing changed.
TEST_F(StepService, BadContributionsAreRefusedNamingTheField) {
  Create("qat/b");
  ASSERT_TRUE(StepCall(*stub_, "qat/b", 0, 0, 1, {1, 2}, 0).status.ok());
  const v1::Session before = Get("qat/b");
  struct Bad {
    int64_t step;
    int32_t rank, world;
    std::vector<float> values;
    StatusCode code;
    const char* named;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Bad& bad : std::vector<Bad>{
           {1, 2, 2, {1}, StatusCode::INVALID_ARGUMENT, "rank"},
           {1, -1, 2, {1}, StatusCode::INVALID_ARGUMENT, "rank"},
           {-1, 0, 1, {1}, StatusCode::INVALID_ARGUMENT, "step"},
           {5000, 0, 1, {1}, StatusCode::FAILED_PRECONDITION, "step"},
           {1, 0, 0, {1}, StatusCode::INVALID_ARGUMENT, "world_size"},
           {1, 0, 1, {nan, 1}, StatusCode::INVALID_ARGUMENT, ""},
       }) {
    v1::StepRequest request;
    request.set_rank(bad.rank);
    request.set_world_size(bad.world);
    v1::StepContribution* c = request.add_contributions();
    c->set_name("qat/b");
    c->set_step(bad.step);
    *c->mutable_tensor() = Floats(bad.values);
    grpc::ClientContext context;
    v1::StepResponse response;
    ASSERT_TRUE(stub_->Step(&context, request, &response).ok());
    const v1::RpcStatus& status = response.contributions(0).status();
    EXPECT_EQ(status.code(), static_cast<int>(bad.code)) << status.message();
    EXPECT_TRUE(absl::StrContains(status.message(), bad.named)) << status.message();
    EXPECT_TRUE(absl::StrContains(status.message(), "session qat/b")) << status.message();
    v1::Session after = Get("qat/b");
    after.clear_update_time();
    v1::Session expected = before;
    expected.clear_update_time();
    EXPECT_TRUE(Same(after, expected)) << status.message();
  }
  // A bad step timeout refuses the whole call.
  v1::StepRequest request;
  request.set_world_size(1);
  request.mutable_step_timeout()->set_seconds(-1);
  grpc::ClientContext context;
  v1::StepResponse response;
  const grpc::Status status = stub_->Step(&context, request, &response);
  EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "step_timeout")) << status.error_message();
}

// A read waiting for the caller's own refused contribution would wait in vain: it is
// answered at once with the refusal.
TEST_F(StepService, AReadAfterItsOwnRefusedContributionAnswersAtOnce) {
  Create("qat/own");
  const Call call = StepCall(*stub_, "qat/own", 0, 0, 1,
                             {1, std::numeric_limits<float>::infinity()}, 0, absl::Seconds(30));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.response.contributions(0).status().code(),
            static_cast<int>(StatusCode::INVALID_ARGUMENT));
  const v1::RpcStatus& read = call.response.reads(0).status();
  EXPECT_EQ(read.code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));
  EXPECT_TRUE(absl::StrContains(read.message(), "contribution to step 0 was refused"))
      << read.message();
}

TEST_F(StepService, ATimedOutStepNamesTheMissingRank) {
  Create("qat/t");
  v1::StepRequest request;
  request.set_rank(0);
  request.set_world_size(3);
  request.mutable_step_timeout()->set_nanos(50'000'000);
  v1::StepContribution* c = request.add_contributions();
  c->set_name("qat/t");
  c->set_step(0);
  *c->mutable_tensor() = Floats({1, 2});
  request.add_reads()->set_name("qat/t");  // waits for the timeout to close step 0
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::StepResponse response;
  ASSERT_TRUE(stub_->Step(&context, request, &response).ok());
  EXPECT_EQ(response.reads(0).step(), 0);
  EXPECT_TRUE(response.reads(0).initialized());
  const v1::Session session = Get("qat/t");
  ASSERT_EQ(session.steps().incomplete_size(), 1);
  EXPECT_EQ(session.steps().incomplete(0).step(), 0);
  EXPECT_EQ(session.steps().incomplete(0).world_size(), 3);
  EXPECT_EQ(std::vector<int32_t>(session.steps().incomplete(0).missing_ranks().begin(),
                                 session.steps().incomplete(0).missing_ranks().end()),
            (std::vector<int32_t>{1, 2}));
}

}  // namespace
}  // namespace qparams::testing
