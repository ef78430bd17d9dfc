// StepMerge (shared/docs/qat.md §2-§4, §6): the worked example of §7; the property
// of §3 (W in {1, 2, 4} ranks contributing random batches, some with nothing, in
// random arrival orders with retries, end every step bit for bit where one process
// running the calculator on the concatenated batches is); retries, bad
// contributions, steps closed by their timeout, reads as of a step.

#include "core/step_merge.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/registry.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

std::unique_ptr<StatefulQParamsCalculatorBase> MakeCalculator(const std::string& key,
                                                              const QuantSpec& spec,
                                                              double averaging_constant = 0.01) {
  CalculatorOptions options;
  if (key == "moving_average") options.averaging_constant = averaging_constant;
  absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> calc = Create(key, spec, options);
  EXPECT_TRUE(calc.ok()) << calc.status();
  return std::unique_ptr<StatefulQParamsCalculatorBase>(AsStateful(calc->release()));
}

// A merge over `calc` that records the calculator's state after every step.
struct Merged {
  std::unique_ptr<StatefulQParamsCalculatorBase> calc;
  StepMerge merge;
  std::map<int64_t, CalculatorState> after;

  absl::StatusOr<StepMerge::Outcome> Contribute(int64_t step, int32_t rank, int32_t world,
                                                const std::optional<Tensor>& batch) {
    StepContribution c{step, rank, world, std::nullopt};
    if (batch.has_value()) {
      QPARAMS_ASSIGN_OR_RETURN(c.range, calc->ReduceRange(Obs(*batch)));
    }
    return merge.Contribute(std::move(c), [&](int64_t t, const std::optional<ReducedRange>& r) {
      return ApplyStep(t, r);
    });
  }
  absl::Status Close(int64_t step) {
    return merge.Close(
        step, [&](int64_t t, const std::optional<ReducedRange>& r) { return ApplyStep(t, r); });
  }
  absl::StatusOr<QParams> ApplyStep(int64_t step, const std::optional<ReducedRange>& r) {
    if (r.has_value()) {
      QPARAMS_RETURN_IF_ERROR(
          calc->Forward(
                  Observation::FromRange(r->input_shape, r->range.min.view(), r->range.max.view()))
              .status());
    }
    after[step] = calc->ExportState();
    return calc->GetQParams();
  }
};

std::vector<float> RunningMin(const CalculatorState& s) {
  return s.running ? std::vector<float>(s.running->lo.begin(), s.running->lo.end())
                   : std::vector<float>();
}
std::vector<float> RunningMax(const CalculatorState& s) {
  return s.running ? std::vector<float>(s.running->hi.begin(), s.running->hi.end())
                   : std::vector<float>();
}

// qat.md §7: moving_average, c = 0.5, float32, per_tensor, W = 2.
TEST(StepMerge, TheWorkedExampleOfQatMd) {
  const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric);
  Merged m;
  m.calc = MakeCalculator("moving_average", spec, 0.5);
  ASSERT_OK(m.Contribute(0, 1, 2, Vec({-3, 1})));
  EXPECT_TRUE(m.after.empty()) << "step 0 waits for rank 0";
  ASSERT_OK(m.Contribute(0, 0, 2, Vec({-1, 2})));
  ASSERT_OK(m.Contribute(1, 1, 2, std::nullopt));  // rank 1 skipped the module
  ASSERT_OK(m.Contribute(2, 1, 2, Vec({-2, 6})));
  ASSERT_OK(m.Contribute(1, 0, 2, Vec({-1, 4})));
  EXPECT_EQ(m.merge.last_applied(), 1);
  ASSERT_OK(m.Contribute(2, 0, 2, Vec({0.5, 2})));
  ASSERT_EQ(m.merge.last_applied(), 2);
  EXPECT_EQ(RunningMin(m.after[0]), std::vector<float>({-3}));
  EXPECT_EQ(RunningMax(m.after[0]), std::vector<float>({2}));
  EXPECT_EQ(RunningMin(m.after[1]), std::vector<float>({-2}));
  EXPECT_EQ(RunningMax(m.after[1]), std::vector<float>({3}));
  EXPECT_EQ(RunningMin(m.after[2]), std::vector<float>({-2}));
  EXPECT_EQ(RunningMax(m.after[2]), std::vector<float>({4.5}));

  // One process on the concatenated batches reaches the same bits.
  std::unique_ptr<StatefulQParamsCalculatorBase> one = MakeCalculator("moving_average", spec, 0.5);
  ASSERT_OK(Fwd(*one, Vec({-1, 2, -3, 1})));
  ASSERT_OK(Fwd(*one, Vec({-1, 4})));
  ASSERT_OK(Fwd(*one, Vec({0.5, 2, -2, 6})));
  EXPECT_TRUE(SameState(one->ExportState(), m.after[2]));
}

struct PropertyCase {
  std::string calculator;
  std::string dtype;  // the input's
  Granularity granularity;
};

DType InputDType(const std::string& name) {
  return name == "float16"    ? DType::kFloat16
         : name == "bfloat16" ? DType::kBFloat16
                              : DType::kFloat32;
}

// qat.md §3's equivalence, over many runs: after every step the merged state is bit
// for bit the state of one calculator fed the concatenation of that step's batches.
TEST(StepMerge, EveryStepEqualsOneProcessOnTheConcatenatedBatches) {
  const PropertyCase cases[] = {
      {"moving_average", "float32", Granularity::PerTensor()},
      {"moving_average", "bfloat16", Granularity::PerChannel(1)},
      {"global_minmax", "float16", Granularity::PerBlock({-1, 2})},
      {"static", "float32", Granularity::PerChannel(1)},
      {"moving_average", "float16", Granularity::PerBlock({-1, 2})},
  };
  constexpr int kSteps = 24, kChannels = 4;
  int runs = 0;
  for (const PropertyCase& pc : cases) {
    for (int world : {1, 2, 4}) {
      for (uint32_t seed = 1; seed <= 6; ++seed) {
        std::mt19937 rng(seed * 7919 + world * 31 + runs);
        const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric, pc.granularity);
        // batches[t][r]: rank r's input of step t, or nothing (one in five).
        std::vector<std::vector<std::optional<Tensor>>> batches(kSteps);
        for (int t = 0; t < kSteps; ++t) {
          for (int r = 0; r < world; ++r) {
            if (t > 0 && rng() % 5 == 0) {
              batches[t].push_back(std::nullopt);
              continue;
            }
            const int rows = 1 + static_cast<int>(rng() % 3);
            std::vector<double> values =
                RandN(rows * kChannels, rng(), 1.0 + static_cast<double>(rng() % 8));
            batches[t].push_back(MakeTensor(InputDType(pc.dtype), {rows, kChannels}, values));
          }
        }
        // The reference: one process, one forward per step on the concatenation.
        std::unique_ptr<StatefulQParamsCalculatorBase> one =
            MakeCalculator(pc.calculator, spec, 0.25);
        std::vector<CalculatorState> expected;
        for (int t = 0; t < kSteps; ++t) {
          std::vector<double> rows;
          int count = 0;
          for (const std::optional<Tensor>& b : batches[t]) {
            if (!b.has_value()) continue;
            const std::vector<double> v = Values(b->view());
            rows.insert(rows.end(), v.begin(), v.end());
            count += static_cast<int>(b->shape[0]);
          }
          if (count > 0) {
            ASSERT_OK(Fwd(*one, MakeTensor(InputDType(pc.dtype), {count, kChannels}, rows)));
          }
          expected.push_back(one->ExportState());
        }
        // Arrival: every (step, rank) once, shuffled within a window of 3 steps, and
        // one in six sent twice (a retry, with a different tensor that must not count).
        std::vector<std::pair<int, int>> arrivals;
        for (int t = 0; t < kSteps; ++t) {
          for (int r = 0; r < world; ++r) arrivals.emplace_back(t, r);
        }
        for (size_t i = 0; i < arrivals.size(); ++i) {
          const size_t j = std::min(arrivals.size() - 1, i + rng() % (3 * world));
          std::swap(arrivals[i], arrivals[j]);
        }
        Merged m;
        m.calc = MakeCalculator(pc.calculator, spec, 0.25);
        for (const auto& [t, r] : arrivals) {
          absl::StatusOr<StepMerge::Outcome> first = m.Contribute(t, r, world, batches[t][r]);
          ASSERT_OK(first);
          EXPECT_FALSE(first->duplicate);
          if (rng() % 6 == 0) {
            absl::StatusOr<StepMerge::Outcome> retry = m.Contribute(
                t, r, world, MakeTensor(InputDType(pc.dtype), {1, kChannels}, {-99, 99, -99, 99}));
            ASSERT_OK(retry);
            EXPECT_TRUE(retry->duplicate);
          }
        }
        ASSERT_EQ(m.merge.last_applied(), kSteps - 1);
        for (int t = 0; t < kSteps; ++t) {
          ASSERT_TRUE(SameState(m.after[t], expected[t]))
              << pc.calculator << " " << pc.dtype << " W=" << world << " seed " << seed << " step "
              << t;
        }
        ++runs;
      }
    }
  }
  EXPECT_EQ(runs, 5 * 3 * 6);
}

TEST(StepMerge, RefusesBadContributionsAndChangesNothing) {
  const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric, Granularity::PerChannel(1));
  Merged m;
  m.calc = MakeCalculator("moving_average", spec);
  ASSERT_OK(m.Contribute(0, 0, 2, F32({1, 2}, {-1, 1})));
  struct Bad {
    int64_t step;
    int32_t rank, world;
    std::optional<Tensor> batch;
    absl::StatusCode code;
    std::string says;
  };
  const Bad bad[] = {
      {0, 2, 2, F32({1, 2}, {0, 0}), kInvalid, "rank is 2"},
      {0, -1, 2, F32({1, 2}, {0, 0}), kInvalid, "rank is -1"},
      {0, 0, 0, F32({1, 2}, {0, 0}), kInvalid, "world_size is 0"},
      {-1, 0, 2, F32({1, 2}, {0, 0}), kInvalid, "step is -1"},
      {StepMerge::kMaxStepsAhead, 0, 2, std::nullopt, kPrecondition, "steps ahead"},
      {0, 1, 4, F32({1, 2}, {0, 0}), kPrecondition, "declared with world_size 2"},
      {0, 1, 2, MakeTensor(DType::kFloat16, {1, 2}, {0, 0}), kPrecondition, "dtypes"},
      {0, 1, 2, F32({1, 3}, {0, 0, 0}), kPrecondition, "shapes"},
  };
  for (const Bad& b : bad) {
    absl::StatusOr<StepMerge::Outcome> refused = m.Contribute(b.step, b.rank, b.world, b.batch);
    EXPECT_CODE(refused, b.code) << b.says;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), b.says)) << refused.status();
  }
  // Non-finite values are the calculator's refusal, before the merge.
  EXPECT_CODE(m.calc->ReduceRange(Obs(F32({1, 2}, {0, std::numeric_limits<double>::quiet_NaN()}))),
              kInvalid);
  EXPECT_EQ(m.merge.pending_steps(), std::vector<int64_t>({0}));
  ASSERT_OK(m.Contribute(0, 1, 2, F32({2, 2}, {-2, 0, 3, 4})));
  EXPECT_EQ(m.merge.last_applied(), 0);
  EXPECT_EQ(RunningMin(m.after[0]), std::vector<float>({-2, 0}));
  EXPECT_EQ(RunningMax(m.after[0]), std::vector<float>({3, 4}));
}

TEST(StepMerge, TheTimeoutClosesStepsAndNamesTheMissingRanks) {
  Merged m;
  m.calc = MakeCalculator("global_minmax", MakeSpec("int8", QScheme::kSymmetric));
  ASSERT_OK(m.Contribute(0, 0, 3, Vec({-1, 1})));
  ASSERT_OK(m.Contribute(0, 2, 3, Vec({-2, 1})));
  ASSERT_OK(m.Contribute(1, 0, 3, Vec({-5, 1})));
  ASSERT_OK(m.Contribute(2, 0, 3, Vec({-1, 7})));
  ASSERT_OK(m.Contribute(2, 1, 3, Vec({-1, 1})));
  ASSERT_OK(m.Contribute(2, 2, 3, Vec({-1, 1})));
  EXPECT_EQ(m.merge.last_applied(), -1) << "step 0 lacks rank 1";
  ASSERT_OK(m.Close(0));
  // Step 1 is still open (ranks 1 and 2); step 2 is complete but waits for it.
  EXPECT_EQ(m.merge.last_applied(), 0);
  ASSERT_OK(m.Close(1));
  EXPECT_EQ(m.merge.last_applied(), 2);
  ASSERT_EQ(m.merge.incomplete().size(), 2u);
  EXPECT_EQ(m.merge.incomplete()[0].step, 0);
  EXPECT_EQ(m.merge.incomplete()[0].missing_ranks, std::vector<int32_t>({1}));
  EXPECT_EQ(m.merge.incomplete()[1].missing_ranks, std::vector<int32_t>({1, 2}));
  EXPECT_EQ(RunningMin(m.after[2]), std::vector<float>({-5}));
  EXPECT_EQ(RunningMax(m.after[2]), std::vector<float>({7}));
  // The late rank is told its step closed; a retry of a contributed one is a retry.
  absl::StatusOr<StepMerge::Outcome> late = m.Contribute(0, 1, 3, Vec({-9, 9}));
  EXPECT_CODE(late, kPrecondition);
  EXPECT_TRUE(absl::StrContains(late.status().message(), "closed without rank 1"));
  ASSERT_OK_AND_ASSIGN(StepMerge::Outcome retry, m.Contribute(0, 2, 3, Vec({-9, 9})));
  EXPECT_TRUE(retry.duplicate);
  // A step nobody contributed to closes with every rank missing... of no world size.
  ASSERT_OK(m.Close(3));
  EXPECT_EQ(m.merge.incomplete().back().step, 3);
  EXPECT_EQ(m.merge.last_applied(), 3);
}

TEST(StepMerge, ReadsAsOfAStepAreTheSameBitsWhateverCameAfter) {
  Merged m;
  m.calc = MakeCalculator("moving_average", MakeSpec("int8", QScheme::kAsymmetric), 0.5);
  ASSERT_OK_AND_ASSIGN(std::optional<QParams> before, m.merge.AsOf(0));
  EXPECT_FALSE(before.has_value());
  ASSERT_OK(m.Contribute(0, 0, 1, Vec({-1, 1})));
  ASSERT_OK_AND_ASSIGN(std::optional<QParams> step0, m.merge.AsOf(0));
  ASSERT_TRUE(step0.has_value());
  for (int t = 1; t <= StepMerge::kKeptSteps; ++t)
    ASSERT_OK(m.Contribute(t, 0, 1, Vec({-1.0 * t, 1.0 * t})));
  EXPECT_CODE(m.merge.AsOf(0), kPrecondition);
  ASSERT_OK_AND_ASSIGN(std::optional<QParams> step1, m.merge.AsOf(1));
  ASSERT_TRUE(step1.has_value());
  EXPECT_EQ(*m.merge.latest(), m.calc->GetQParams());
  EXPECT_FALSE(*step1 == m.calc->GetQParams());
}

// A merge exported (a session's record) and restored halfway continues as the one
// that never stopped; a state that does not hold together is refused.
TEST(StepMerge, ARestoredStateContinuesBitIdentically) {
  const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric, Granularity::PerChannel(1));
  auto feed = [](Merged& m, int from, int to) {
    for (int t = from; t < to; ++t) {
      for (int r : {1, 0, 2}) {
        if ((t + r) % 4 == 0) continue;  // left open for a while
        ASSERT_OK(m.Contribute(t, r, 3, F32({2, 2}, RandN(4, 100 * t + r, 1 + t % 3))));
      }
    }
  };
  Merged whole, before, after;
  whole.calc = MakeCalculator("moving_average", spec, 0.3);
  before.calc = MakeCalculator("moving_average", spec, 0.3);
  feed(whole, 0, 12);
  feed(before, 0, 12);
  ASSERT_OK(whole.Close(5));
  ASSERT_OK(before.Close(5));
  ASSERT_OK_AND_ASSIGN(after.merge, StepMerge::FromState(before.merge.ExportState()));
  after.calc = before.calc->Clone();
  for (Merged* m : {&whole, &after}) {
    for (int t = 6; t < 12; ++t) {
      for (int r = 0; r < 3; ++r) {
        if ((t + r) % 4 == 0) {
          ASSERT_OK(m->Contribute(t, r, 3, std::nullopt));
        }
      }
    }
  }
  EXPECT_EQ(whole.merge.last_applied(), 11);
  EXPECT_EQ(after.merge.last_applied(), 11);
  for (int t = 6; t < 12; ++t) EXPECT_TRUE(SameState(whole.after[t], after.after[t])) << t;
  for (int t = 4; t < 12; ++t) {
    ASSERT_OK_AND_ASSIGN(std::optional<QParams> a, whole.merge.AsOf(t));
    ASSERT_OK_AND_ASSIGN(std::optional<QParams> b, after.merge.AsOf(t));
    EXPECT_TRUE(a == b) << t;
  }
  EXPECT_EQ(whole.merge.incomplete().size(), after.merge.incomplete().size());

  const StepState good = before.merge.ExportState();
  ASSERT_FALSE(good.pending.empty());
  ASSERT_FALSE(good.applied.empty());
  std::vector<StepState> bad(5, good);
  bad[0].applied.front().step -= 1;                     // a gap in the kept steps
  bad[1].pending.front().step = good.last_applied;      // pending but applied
  bad[2].pending.front().contributed.push_back(true);   // a rank map of another world
  bad[3].pending.front().contributed.assign(3, false);  // pending with no contribution
  bad[4].last_applied = -5;
  for (size_t i = 0; i < bad.size(); ++i) {
    absl::StatusOr<StepMerge> refused = StepMerge::FromState(bad[i]);
    EXPECT_CODE(refused, kInvalid) << i;
    EXPECT_TRUE(absl::StartsWith(refused.status().message(), "steps: ")) << refused.status();
  }
}

}  // namespace
}  // namespace qparams::testing
