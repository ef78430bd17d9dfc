// Step-merged sessions through the Engine (shared/docs/qat.md §2-§6): the steps are
// journaled with their contributions and restored after a restart, which then
// completes them as if it had not stopped; a step left open is closed by its timeout,
// naming the missing rank; reads wait for their step; ordinary observations, histogram
// kinds and export mode refuse contributions; refusals change nothing.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/registry.h"
#include "domain/engine.h"
#include "domain/session.h"
#include "gtest/gtest.h"
#include "metrics/metrics.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

class EngineSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/qparams_steps.XXXXXX");
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  EngineOptions Options() {
    EngineOptions options;
    options.journal.data_dir = dir_;
    options.journal.durability = Durability::kAlways;
    options.step_contributions = &contributions_;
    options.steps_closed_incomplete = &closed_;
    return options;
  }
  static absl::Status Create(Engine& engine, const std::string& name,
                             const std::string& calculator = "moving_average") {
    CalculatorOptions options;
    if (calculator == "moving_average") options.averaging_constant = 0.5;
    return engine
        .CreateSession("", name, calculator, MakeSpec("int8", QScheme::kAsymmetric), options)
        .status();
  }
  static absl::StatusOr<StepMerge::Outcome> Put(Engine& engine, const std::string& name,
                                                int64_t step, int32_t rank, int32_t world,
                                                const std::optional<Tensor>& x,
                                                absl::Duration timeout = absl::Minutes(5)) {
    std::optional<Observation> observation;
    if (x.has_value()) observation = Observation::FromTensor(x->view());
    return engine.Contribute("", name, step, rank, world, observation, timeout);
  }

  std::string dir_;
  Counter contributions_, closed_;
};

TEST_F(EngineSteps, AContributionIsDurableAndARestartCompletesTheStep) {
  std::optional<SessionInfo> reference;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(Options()));
    ASSERT_OK(Create(*engine, "qat/a"));
    ASSERT_OK(Create(*engine, "qat/ref"));
    ASSERT_OK(Put(*engine, "qat/a", 0, 0, 2, Vec({-1, 2})));
    ASSERT_OK(Put(*engine, "qat/a", 0, 1, 2, Vec({-3, 1})));
    ASSERT_OK(Put(*engine, "qat/a", 1, 0, 2, Vec({-1, 4})));  // step 1 waits for rank 1
    // The reference: one process on the concatenated batches.
    ASSERT_OK(
        engine->Observe("", "qat/ref", Observation::FromTensor(Vec({-1, 2, -3, 1}).view())).status);
    ASSERT_OK(
        engine->Observe("", "qat/ref", Observation::FromTensor(Vec({-1, 4, 5}).view())).status);
    reference = *engine->GetSession("", "qat/ref");
    EXPECT_EQ(contributions_.value(), 3u);
    // Ordinary observations are refused once a session is step-merged.
    ObserveOutcome refused = engine->Observe("", "qat/a", Observation::FromTensor(Vec({9}).view()));
    EXPECT_CODE(refused.status, kPrecondition);
    EXPECT_TRUE(absl::StrContains(refused.status.message(), "step-merged"));
    ASSERT_OK(engine->Close());
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(Options()));
  ASSERT_OK_AND_ASSIGN(std::optional<StepState> steps, engine->Steps("", "qat/a"));
  ASSERT_TRUE(steps.has_value());
  EXPECT_EQ(steps->last_applied, 0);
  ASSERT_EQ(steps->pending.size(), 1u);
  // A retry of the acknowledged contribution is answered as a retry after the restart.
  ASSERT_OK_AND_ASSIGN(StepMerge::Outcome retry, Put(*engine, "qat/a", 1, 0, 2, Vec({-50, 50})));
  EXPECT_TRUE(retry.duplicate);
  ASSERT_OK(Put(*engine, "qat/a", 1, 1, 2, Vec({5})));
  ASSERT_OK_AND_ASSIGN(SessionInfo a, engine->GetSession("", "qat/a"));
  EXPECT_EQ(a.running_min, reference->running_min);
  EXPECT_EQ(a.running_max, reference->running_max);
  EXPECT_TRUE(a.qparams == reference->qparams);
  ASSERT_OK_AND_ASSIGN(Session::StepRead read,
                       engine->ReadStep("", "qat/a", 1, absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(read.step, 1);
  ASSERT_TRUE(read.qparams.has_value());
  EXPECT_TRUE(*read.qparams == reference->qparams);
}

TEST_F(EngineSteps, TheTimeoutClosesAStepAndTheRunGoesOn) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(Options()));
  ASSERT_OK(Create(*engine, "qat/t"));
  ASSERT_OK(Put(*engine, "qat/t", 0, 0, 2, Vec({-1, 1}), absl::Milliseconds(50)));
  // Rank 1 never comes: the reader of step 0 is woken by the timeout's close.
  ASSERT_OK_AND_ASSIGN(Session::StepRead read,
                       engine->ReadStep("", "qat/t", 0, absl::Now() + absl::Seconds(30)));
  ASSERT_TRUE(read.qparams.has_value());
  absl::StatusOr<std::optional<StepState>> steps = engine->Steps("", "qat/t");
  ASSERT_OK(steps);
  ASSERT_TRUE(steps->has_value());
  const std::vector<IncompleteStep>& incomplete = (*steps)->incomplete;
  ASSERT_EQ(incomplete.size(), 1u);
  EXPECT_EQ(incomplete[0].step, 0);
  EXPECT_EQ(incomplete[0].missing_ranks, std::vector<int32_t>({1}));
  EXPECT_EQ(closed_.value(), 1u);
  // The late rank is told; the run goes on with both.
  EXPECT_CODE(Put(*engine, "qat/t", 0, 1, 2, Vec({-9, 9})), kPrecondition);
  ASSERT_OK(Put(*engine, "qat/t", 1, 1, 2, Vec({-2, 2})));
  ASSERT_OK(Put(*engine, "qat/t", 1, 0, 2, Vec({-2, 2})));
  ASSERT_OK_AND_ASSIGN(read, engine->ReadStep("", "qat/t", std::nullopt, absl::Now()));
  EXPECT_EQ(read.step, 1);
}

TEST_F(EngineSteps, AReadWaitsForItsStepOrItsDeadline) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(Options()));
  ASSERT_OK(Create(*engine, "qat/r"));
  ASSERT_OK(Put(*engine, "qat/r", 0, 0, 2, Vec({-1, 1})));
  absl::StatusOr<Session::StepRead> late =
      engine->ReadStep("", "qat/r", 0, absl::Now() + absl::Milliseconds(20));
  EXPECT_CODE(late, absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(late.status().message(), "step 0 of session qat/r"));
  std::thread rank1([&] { ASSERT_OK(Put(*engine, "qat/r", 0, 1, 2, Vec({-2, 3}))); });
  ASSERT_OK_AND_ASSIGN(Session::StepRead read,
                       engine->ReadStep("", "qat/r", 0, absl::Now() + absl::Seconds(30)));
  rank1.join();
  EXPECT_EQ(read.step, 0);
  ASSERT_TRUE(read.qparams.has_value());
}

TEST_F(EngineSteps, KindsAndStatesThatCannotMergeStepsRefuseAndChangeNothing) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(Options()));
  ASSERT_OK(
      engine->CreateSession("", "qat/h", "percentile", MakeSpec("int8", QScheme::kSymmetric), {})
          .status());
  EXPECT_CODE(Put(*engine, "qat/h", 0, 0, 1, Vec({1})), kPrecondition);
  ASSERT_OK(Create(*engine, "qat/x"));
  ASSERT_OK(engine->SetExportMode("", "qat/x", true).status());
  EXPECT_CODE(Put(*engine, "qat/x", 0, 0, 1, Vec({1})), kPrecondition);
  EXPECT_CODE(Put(*engine, "qat/none", 0, 0, 1, Vec({1})), absl::StatusCode::kNotFound);
  ASSERT_OK(Create(*engine, "qat/bad"));
  EXPECT_CODE(Put(*engine, "qat/bad", 0, 0, 1, Vec({1}), absl::ZeroDuration()), kInvalid);
  EXPECT_CODE(Put(*engine, "qat/bad", 0, 0, 1, Vec({std::nan("")})), kInvalid);
  EXPECT_CODE(Put(*engine, "qat/bad", 0, 3, 2, Vec({1})), kInvalid);
  ASSERT_OK_AND_ASSIGN(std::optional<StepState> steps, engine->Steps("", "qat/bad"));
  EXPECT_FALSE(steps.has_value()) << "a refused first contribution leaves the session as it was";
  ASSERT_OK(engine->Observe("", "qat/bad", Observation::FromTensor(Vec({1}).view())).status);
  EXPECT_EQ(contributions_.value(), 0u);
}

// A log whose appends fail on demand (a full disk), counting what it took.
class FailingLog final : public SessionLog {
 public:
  bool fail = false;
  int puts = 0;
  int contributions = 0;
  bool keeps_records() const override { return true; }
  absl::StatusOr<uint64_t> AppendPut(const SessionKey&, const CalculatorState&, absl::Time,
                                     absl::Time, const DedupeWindow&,
                                     const std::optional<StepState>&) override {
    if (fail) return absl::UnavailableError("the disk is full");
    return ++puts;
  }
  absl::StatusOr<uint64_t> AppendContribution(const SessionKey&, const StepContribution&,
                                              absl::Time) override {
    if (fail) return absl::UnavailableError("the disk is full");
    ++contributions;
    return 0;
  }
  absl::StatusOr<uint64_t> AppendErase(const SessionKey&) override { return 0; }
  absl::StatusOr<uint64_t> AppendEviction(const SessionKey&, absl::Time) override { return 0; }
  absl::StatusOr<uint64_t> AppendGroupCreate(absl::string_view, const ScaleGroupInfo&) override {
    return 0;
  }
  absl::StatusOr<uint64_t> AppendGroupDelete(absl::string_view, absl::string_view) override {
    return 0;
  }
  absl::Status Sync(uint64_t) override { return absl::OkStatus(); }
  absl::Status health() const override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }
};

// A contribution whose record cannot be written changes nothing, whether it merged
// in place (it applies no step) or on a copy (it completes one).
TEST(SessionSteps, AContributionTheLogRefusesChangesNothing) {
  FailingLog log;
  CalculatorOptions options;
  options.averaging_constant = 0.5;
  auto calculator = QParamsCalculatorRegistry::Global().CreateStateful(
      "moving_average", MakeSpec("int8", QScheme::kAsymmetric), options);
  ASSERT_TRUE(calculator.ok()) << calculator.status();
  Session session(SessionKey{"", "s"}, *std::move(calculator), log, absl::Now(), absl::Now());
  auto put = [&](int64_t step, int32_t rank, std::vector<double> values) {
    const Tensor x = Vec(values);
    return session.Contribute(step, rank, 3, Observation::FromTensor(x.view()));
  };
  ASSERT_TRUE(put(0, 0, {-1, 2}).ok());  // the first: on a copy
  const std::optional<StepState> one = session.Steps();
  log.fail = true;
  for (const auto& [rank, values] :
       std::vector<std::pair<int32_t, std::vector<double>>>{{1, {-5, 9}}, {1, {0, 1}}}) {
    EXPECT_EQ(put(0, rank, values).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(put(1, rank, values).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(session.Steps()->pending.size(), one->pending.size());
    EXPECT_EQ(session.Steps()->pending[0].contributed, one->pending[0].contributed);
  }
  log.fail = false;
  ASSERT_TRUE(put(0, 1, {-3, 1}).ok());  // in place
  log.fail = true;
  EXPECT_EQ(put(0, 2, {-7, 7}).status().code(), absl::StatusCode::kUnavailable);  // on a copy
  EXPECT_EQ(session.Steps()->last_applied, -1);
  log.fail = false;
  ASSERT_TRUE(put(0, 2, {0.5, 0.5}).ok());
  // Step 0's range is (-3, 2): the refused contributions left nothing behind.
  const SessionInfo info = session.Info();
  EXPECT_EQ(info.running_min, std::vector<float>{-3});
  EXPECT_EQ(info.running_max, std::vector<float>{2});
  EXPECT_EQ(log.puts, 2);  // the first contribution, and the one that applied step 0
  EXPECT_EQ(log.contributions, 1);
}

}  // namespace
}  // namespace qparams::testing
