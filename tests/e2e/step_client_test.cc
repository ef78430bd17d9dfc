// Step-merged sessions (docs/qat.md) through the C++ client and qparams-cli, against
// an in-process server: ranks on threads of their own, each with its own Client (as
// processes would be), reading identical bits as of each step, bit for bit one
// process's on the concatenated batches; a read that outlives its deadline; retries
// answered as duplicates, also after a lost answer (tests/cutting_proxy.h); a job
// resumed from a checkpoint; and `qparams-cli steps` naming the rank a step was
// closed without. Nothing waits by sleeping: a read returns once its step applied.
// The split over sharded replicas is in sharded_client_test.cc.

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "qparams/client.h"
#include "tests/support/cutting_proxy.h"
#include "tests/server/service_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

// A moving_average activation session with c = 0.5, as docs/reference/qat.md §7.
v1::CreateSessionRequest Activation(const std::string& name) {
  v1::CreateSessionRequest request;
  request.set_name(name);
  request.set_calculator("moving_average");
  request.set_averaging_constant(0.5);
  request.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  request.mutable_spec()->set_target(v1::ACTIVATION);
  return request;
}

v1::StepRead ReadAt(const std::string& name, int64_t step, bool checkpoint = false) {
  v1::StepRead read;
  read.set_name(name);
  read.set_step(step);
  read.set_checkpoint(checkpoint);
  return read;
}

// Rank `rank` of `world_size`'s step: `contributions`, then `reads`; a step's first
// contribution gives the others `step_timeout`.
v1::StepRequest StepOf(int rank, int world_size, std::vector<v1::StepContribution> contributions,
                       std::vector<v1::StepRead> reads,
                       absl::Duration step_timeout = absl::Hours(1)) {
  v1::StepRequest request;
  request.set_rank(rank);
  request.set_world_size(world_size);
  request.mutable_step_timeout()->set_seconds(absl::ToInt64Seconds(step_timeout));
  request.mutable_step_timeout()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(step_timeout % absl::Seconds(1))));
  for (v1::StepContribution& c : contributions) *request.add_contributions() = std::move(c);
  for (v1::StepRead& r : reads) *request.add_reads() = std::move(r);
  return request;
}

class StepClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(server_->address()));
  }

  // A client of its own, as another rank's process would have.
  std::unique_ptr<Client> Rank() {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server_->address());
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

// docs/reference/qat.md §7 on W = 2, each rank on a thread with a lag of 0 (each
// step's read waits for the other rank's contribution): both read the same bits after
// every step, and they are one process's on the concatenated batches.
TEST_F(StepClientTest, TwoRanksReadTheSameBitsAsOneProcessOnTheGlobalBatch) {
  ASSERT_OK(client_->CreateSession(Activation("qat/act")));
  ASSERT_OK(client_->CreateSession(Activation("qat/one-process")));
  // Each rank's input per step; empty: the rank did not run the module.
  const std::vector<std::vector<double>> inputs[2] = {{{-1, 2}, {-1, 4}, {0.5, 2}},
                                                      {{-3, 1}, {}, {-2, 6}}};
  constexpr int kSteps = 3;
  std::vector<std::string> read[2];
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      std::unique_ptr<Client> client = Rank();
      if (client == nullptr) return;
      for (int step = 0; step < kSteps; ++step) {
        const std::vector<double>& x = inputs[rank][step];
        absl::StatusOr<v1::StepResponse> answer =
            client->Step(StepOf(rank, 2,
                                {x.empty() ? EmptyContribution("qat/act", step)
                                           : TensorContribution("qat/act", step, Vec(x).view())},
                                {ReadAt("qat/act", step)}));
        ASSERT_OK(answer.status());
        ASSERT_EQ(answer->contributions_size(), 1);
        ASSERT_EQ(answer->reads_size(), 1);
        EXPECT_EQ(answer->contributions(0).status().code(), 0)
            << answer->contributions(0).status().message();
        EXPECT_FALSE(answer->contributions(0).duplicate());
        const v1::StepReadResult& result = answer->reads(0);
        EXPECT_EQ(result.status().code(), 0) << result.status().message();
        EXPECT_EQ(result.step(), step);
        EXPECT_TRUE(result.initialized());
        read[rank].push_back(result.qparams().SerializeAsString());
      }
    });
  }
  for (std::thread& rank : ranks) rank.join();
  ASSERT_EQ(read[0].size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(read[1].size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(read[0][step], read[1][step]) << "step " << step;
    std::vector<double> global = inputs[0][step];
    global.insert(global.end(), inputs[1][step].begin(), inputs[1][step].end());
    ASSERT_OK_AND_ASSIGN(const v1::ObserveResponse one,
                         client_->Observe("qat/one-process", Vec(global).view()));
    EXPECT_EQ(read[0][step], one.qparams().SerializeAsString()) << "step " << step;
  }
  ASSERT_OK_AND_ASSIGN(const v1::Session session, client_->GetSession("qat/act"));
  ASSERT_TRUE(session.has_steps());
  EXPECT_EQ(session.steps().last_applied_step(), kSteps - 1);
  EXPECT_EQ(session.steps().pending_size(), 0);
  EXPECT_EQ(session.steps().incomplete_size(), 0);
}

// A read waits for its step up to the call's deadline: DEADLINE_EXCEEDED while the
// other rank has not contributed (its contribution was applied nonetheless). Once
// it has, the same request again is answered: its contribution a duplicate, applied
// once, and the read the other rank's bits.
TEST_F(StepClientTest, AReadWaitsUntilTheDeadlineAndARetryIsADuplicate) {
  ASSERT_OK(client_->CreateSession(Activation("late")));
  const v1::StepRequest rank0 =
      StepOf(0, 2, {TensorContribution("late", 0, Vec({-1, 2}).view())}, {ReadAt("late", 0)});
  const absl::StatusOr<v1::StepResponse> waited = client_->Step(rank0, absl::Milliseconds(200));
  EXPECT_CODE(waited.status(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_OK_AND_ASSIGN(const v1::Session open, client_->GetSession("late"));
  EXPECT_EQ(open.steps().last_applied_step(), -1);
  ASSERT_EQ(open.steps().pending_size(), 1);
  EXPECT_EQ(std::vector<int32_t>(open.steps().pending(0).missing_ranks().begin(),
                                 open.steps().pending(0).missing_ranks().end()),
            std::vector<int32_t>{1});

  std::unique_ptr<Client> other = Rank();
  ASSERT_NE(other, nullptr);
  ASSERT_OK_AND_ASSIGN(
      const v1::StepResponse rank1,
      other->Step(
          StepOf(1, 2, {TensorContribution("late", 0, Vec({-3, 1}).view())}, {ReadAt("late", 0)})));
  EXPECT_FALSE(rank1.contributions(0).duplicate());
  EXPECT_EQ(rank1.contributions(0).last_applied_step(), 0);
  ASSERT_OK_AND_ASSIGN(const v1::StepResponse again, client_->Step(rank0));
  EXPECT_TRUE(again.contributions(0).duplicate());
  EXPECT_EQ(again.contributions(0).last_applied_step(), 0);
  EXPECT_EQ(again.reads(0).status().code(), 0) << again.reads(0).status().message();
  EXPECT_EQ(again.reads(0).step(), 0);
  EXPECT_EQ(again.reads(0).qparams().SerializeAsString(),
            rank1.reads(0).qparams().SerializeAsString());

  // A retry carrying other values is still the first contribution: nothing changes.
  ASSERT_OK_AND_ASSIGN(
      const v1::StepResponse changed,
      client_->Step(StepOf(0, 2, {TensorContribution("late", 0, Vec({-100, 100}).view())},
                           {ReadAt("late", 0)})));
  EXPECT_TRUE(changed.contributions(0).duplicate());
  EXPECT_EQ(changed.reads(0).qparams().SerializeAsString(),
            rank1.reads(0).qparams().SerializeAsString());
}

// Each item has its own status; one refused item leaves the others applied and read.
TEST_F(StepClientTest, ItemsAreAnsweredOneByOne) {
  ASSERT_OK(client_->CreateSession(Activation("one/a")));
  ASSERT_OK(client_->CreateSession(Activation("one/b")));
  ASSERT_OK_AND_ASSIGN(
      const v1::StepResponse answer,
      client_->Step(StepOf(0, 1,
                           {TensorContribution("one/a", 0, Vec({-1, 1}).view()),
                            TensorContribution("one/missing", 0, Vec({-1, 1}).view()),
                            EmptyContribution("one/b", 0)},
                           {ReadAt("one/a", 0), ReadAt("one/missing", 0), ReadAt("one/b", 0)})));
  ASSERT_EQ(answer.contributions_size(), 3);
  ASSERT_EQ(answer.reads_size(), 3);
  EXPECT_EQ(answer.contributions(0).status().code(), 0);
  EXPECT_EQ(answer.contributions(1).status().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_TRUE(absl::StrContains(answer.contributions(1).status().message(), "one/missing"))
      << answer.contributions(1).status().message();
  EXPECT_EQ(answer.contributions(2).status().code(), 0);
  EXPECT_EQ(answer.reads(0).step(), 0);
  EXPECT_TRUE(answer.reads(0).initialized());
  EXPECT_EQ(answer.reads(1).status().code(), static_cast<int>(absl::StatusCode::kNotFound));
  // A step in which no rank carried a range applies, and changes nothing.
  EXPECT_EQ(answer.reads(2).status().code(), 0) << answer.reads(2).status().message();
  EXPECT_EQ(answer.reads(2).step(), 0);
  EXPECT_FALSE(answer.reads(2).initialized());

  EXPECT_CODE(client_->Step(StepOf(0, 1, {}, {}), absl::ZeroDuration()).status(), kInvalid);
  // The server judges a call of no items too: a step_timeout below 1 ms.
  EXPECT_CODE(client_->Step(StepOf(0, 1, {}, {}, absl::ZeroDuration())).status(), kInvalid);
}

// A job restarted from its checkpoint at step 2 (taken after step 1) continues bit for
// bit as the uninterrupted run, though the crashed job had contributed steps 2 and 3
// with other values: ResumeSteps discards them, and the replayed steps apply.
TEST_F(StepClientTest, AResumedJobContinuesAsTheUninterruptedRun) {
  ASSERT_OK(client_->CreateSession(Activation("run/straight")));
  ASSERT_OK(client_->CreateSession(Activation("run/resumed")));
  const std::vector<std::vector<double>> inputs = {{-1, 2}, {-3, 5}, {0.5, 7}, {-6, 1}};
  std::string expected;
  for (int step = 0; step < 4; ++step) {
    ASSERT_OK_AND_ASSIGN(
        const v1::StepResponse answer,
        client_->Step(StepOf(0, 1,
                             {TensorContribution("run/straight", step, Vec(inputs[step]).view())},
                             {ReadAt("run/straight", step)})));
    expected = answer.reads(0).qparams().SerializeAsString();
  }
  std::string checkpoint;
  for (int step = 0; step < 4; ++step) {
    const std::vector<double> x = step < 2 ? inputs[step] : std::vector<double>{-50, 50};
    ASSERT_OK_AND_ASSIGN(
        const v1::StepResponse answer,
        client_->Step(StepOf(0, 1, {TensorContribution("run/resumed", step, Vec(x).view())},
                             {ReadAt("run/resumed", step, /*checkpoint=*/step == 1)})));
    ASSERT_EQ(answer.reads(0).status().code(), 0) << answer.reads(0).status().message();
    if (step == 1) checkpoint = answer.reads(0).checkpoint();
  }
  ASSERT_FALSE(checkpoint.empty());

  v1::ResumeStepsRequest resume;
  v1::ResumeItem* item = resume.add_items();
  item->set_name("run/resumed");
  item->set_next_step(2);
  item->set_checkpoint(checkpoint);
  v1::ResumeItem* missing = resume.add_items();
  missing->set_name("run/missing");
  missing->set_next_step(2);
  ASSERT_OK_AND_ASSIGN(const v1::ResumeStepsResponse resumed, client_->ResumeSteps(resume));
  ASSERT_EQ(resumed.statuses_size(), 2);
  EXPECT_EQ(resumed.statuses(0).code(), 0) << resumed.statuses(0).message();
  EXPECT_EQ(resumed.statuses(1).code(), static_cast<int>(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(const v1::Session session, client_->GetSession("run/resumed"));
  EXPECT_EQ(session.steps().last_applied_step(), 1);

  std::string got;
  for (int step = 2; step < 4; ++step) {
    ASSERT_OK_AND_ASSIGN(
        const v1::StepResponse answer,
        client_->Step(StepOf(0, 1,
                             {TensorContribution("run/resumed", step, Vec(inputs[step]).view())},
                             {ReadAt("run/resumed", step)})));
    EXPECT_FALSE(answer.contributions(0).duplicate()) << "step " << step;
    got = answer.reads(0).qparams().SerializeAsString();
  }
  EXPECT_EQ(got, expected);
}

// A Step whose answer is lost after the server applied it (the proxy drops the
// answer, then cuts the connection: UNAVAILABLE) is sent again, and its contribution
// is answered as a duplicate, applied once.
TEST_F(StepClientTest, AStepWhoseAnswerIsLostIsRetriedAndAppliedOnce) {
  ASSERT_OK(client_->CreateSession(Activation("cut")));
  std::unique_ptr<CuttingProxy> proxy = CuttingProxy::Start(server_->address());
  ASSERT_NE(proxy, nullptr);
  ClientOptions options;
  options.retry_initial_backoff = absl::Milliseconds(5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> proxied, Client::Connect(proxy->address(), options));
  // Connected, and the topology read, before answers are dropped.
  ASSERT_OK(proxied->Step(StepOf(0, 1, {TensorContribution("cut", 0, Vec({-1, 1}).view())}, {})));
  proxy->DropAnswers();
  absl::StatusOr<v1::StepResponse> answer;
  std::thread call([&] {
    answer = proxied->Step(
        StepOf(0, 1, {TensorContribution("cut", 1, Vec({-4, 8}).view())}, {ReadAt("cut", 1)}));
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  int64_t applied = -1;
  while (applied < 1 && absl::Now() < deadline) {  // the server applied step 1
    absl::StatusOr<v1::Session> session = client_->GetSession("cut");
    if (session.ok()) applied = session->steps().last_applied_step();
    std::this_thread::yield();
  }
  proxy->Cut();
  call.join();
  ASSERT_EQ(applied, 1);
  ASSERT_OK(answer.status());
  EXPECT_TRUE(answer->contributions(0).duplicate());
  EXPECT_EQ(answer->reads(0).step(), 1);
  ASSERT_OK_AND_ASSIGN(const v1::StepResponse latest,
                       client_->Step(StepOf(0, 1, {}, {ReadAt("cut", 1)})));
  EXPECT_EQ(answer->reads(0).qparams().SerializeAsString(),
            latest.reads(0).qparams().SerializeAsString());
}

// `qparams-cli steps PREFIX`: a run with rank 1 gone after step 0. Step 1 of
// run/a is closed by its 100 ms timeout without it (rank 0's read of step 1 returns
// once it is), run/b waits for it on an open step, and run/w was never stepped.
TEST_F(StepClientTest, TheCliShowsTheRanksARunIsMissing) {
  ASSERT_OK(client_->CreateSession(Activation("run/a")));
  ASSERT_OK(client_->CreateSession(Activation("run/b")));
  ASSERT_OK(client_->CreateSession(Activation("run/w")));
  ASSERT_OK(client_->CreateSession(Activation("other")));
  std::unique_ptr<Client> rank1 = Rank();
  ASSERT_NE(rank1, nullptr);
  ASSERT_OK(rank1->Step(StepOf(1, 2, {TensorContribution("run/a", 0, Vec({-3, 1}).view())}, {})));
  ASSERT_OK_AND_ASSIGN(
      const v1::StepResponse step0,
      client_->Step(StepOf(0, 2, {TensorContribution("run/a", 0, Vec({-1, 2}).view())},
                           {ReadAt("run/a", 0)})));
  EXPECT_EQ(step0.reads(0).step(), 0);
  ASSERT_OK_AND_ASSIGN(
      const v1::StepResponse step1,
      client_->Step(StepOf(0, 2, {TensorContribution("run/a", 1, Vec({-1, 4}).view())},
                           {ReadAt("run/a", 1)}, absl::Milliseconds(100))));
  EXPECT_EQ(step1.reads(0).status().code(), 0) << step1.reads(0).status().message();
  EXPECT_EQ(step1.reads(0).step(), 1);
  ASSERT_OK(client_->Step(StepOf(0, 2, {TensorContribution("run/b", 0, Vec({-1, 2}).view())}, {})));

  std::string dir = absl::StrCat(::testing::TempDir(), "/step_client_test.XXXXXX");
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const auto cli = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {QPARAMS_CLI_PATH, "--target=" + server_->address()});
    return RunProcess(args, dir);
  };
  const ProcessResult table = cli({"steps", "run/", "--format=table"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.err, "");
  EXPECT_EQ(table.out,
            "NAME   LAST_APPLIED  OPEN               CLOSED_INCOMPLETE\n"
            "run/a  1             -                  1 (missing 1)\n"
            "run/b  -1            0 (waiting for 1)  -\n"
            "run/w  -             -                  -\n"
            "sessions 3  stepped 2  last_applied -1..1  with_incomplete 1  missing_ranks 1  "
            "waiting_for_ranks 1\n");

  const ProcessResult json = cli({"steps", "run/"});
  EXPECT_EQ(json.exit_code, 0) << json.err;
  google::protobuf::Struct document;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &document).ok()) << json.out;
  const auto& fields = document.fields();
  EXPECT_EQ(fields.at("prefix").string_value(), "run/");
  EXPECT_EQ(fields.at("session_count").number_value(), 3);
  EXPECT_EQ(fields.at("stepped_count").number_value(), 2);
  EXPECT_EQ(fields.at("last_applied_step_min").number_value(), -1);
  EXPECT_EQ(fields.at("last_applied_step_max").number_value(), 1);
  EXPECT_EQ(fields.at("sessions_with_incomplete_steps").number_value(), 1);
  ASSERT_EQ(fields.at("missing_ranks").list_value().values_size(), 1);
  EXPECT_EQ(fields.at("missing_ranks").list_value().values(0).number_value(), 1);
  const auto& sessions = fields.at("sessions").list_value();
  ASSERT_EQ(sessions.values_size(), 3);
  const auto& a = sessions.values(0).struct_value().fields();
  EXPECT_EQ(a.at("name").string_value(), "run/a");
  EXPECT_TRUE(a.at("stepped").bool_value());
  EXPECT_EQ(a.at("last_applied_step").number_value(), 1);
  const auto& incomplete = a.at("incomplete").list_value();
  ASSERT_EQ(incomplete.values_size(), 1);
  const auto& closed = incomplete.values(0).struct_value().fields();
  EXPECT_EQ(closed.at("step").number_value(), 1);
  EXPECT_EQ(closed.at("world_size").number_value(), 2);
  ASSERT_EQ(closed.at("missing_ranks").list_value().values_size(), 1);
  EXPECT_EQ(closed.at("missing_ranks").list_value().values(0).number_value(), 1);
  const auto& b = sessions.values(1).struct_value().fields();
  const auto& open = b.at("open").list_value();
  ASSERT_EQ(open.values_size(), 1);
  EXPECT_EQ(open.values(0).struct_value().fields().at("step").number_value(), 0);
  EXPECT_FALSE(sessions.values(2).struct_value().fields().at("stepped").bool_value());

  // Without a prefix: every session, "other" too.
  const ProcessResult all = cli({"steps", "--format=table"});
  EXPECT_EQ(all.exit_code, 0) << all.err;
  EXPECT_TRUE(absl::StrContains(all.out, "\nother  -")) << all.out;
  EXPECT_TRUE(absl::StrContains(all.out, "sessions 4  stepped 2")) << all.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qparams::testing
