// Runs every case of the histogram conformance vectors (HistogramVectorsPath())
// through the core calculators and fails on any difference, naming the case, step and
// field. Each case runs twice: with Forward, and with Observe (no search) followed by
// GetQParams, as an observation sent with omit_qparams and a later GetQParams do.
// The members of a group must also end with identical histograms.

#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/histogram_calculator.h"
#include "core/registry.h"
#include "gtest/gtest.h"
#include "tests/support/histogram_vectors.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

enum class Mode { kForward, kObserve };

std::string CalibrationDifference(const ExpectedCalibration& expected,
                                  const HistogramQParamsCalculator& calc) {
  const Histogram& h = calc.histogram();
  if (h.exponent != expected.exponent) {
    return absl::StrCat("exponent: expected ", expected.exponent, ", got ", h.exponent);
  }
  if (h.total() != expected.total_count) {
    return absl::StrCat("total_count: expected ", expected.total_count, ", got ", h.total());
  }
  const std::optional<CalibrationResult> got = calc.calibration();
  if (got.has_value() != expected.amax_bits.has_value()) {
    return absl::StrCat("calibration: expected ", expected.amax_bits ? "a result" : "none",
                        ", got ", got ? "a result" : "none");
  }
  if (!got.has_value()) return "";
  uint64_t bits;
  std::memcpy(&bits, &got->amax, sizeof bits);
  if (bits != *expected.amax_bits) {
    double want;
    std::memcpy(&want, &*expected.amax_bits, sizeof want);
    return absl::StrFormat("amax: expected %a, got %a", want, got->amax);
  }
  if (got->bin_index != expected.bin_index) {
    return absl::StrCat("bin_index: expected ", expected.bin_index.value_or(-1), ", got ",
                        got->bin_index);
  }
  if (got->exponent != expected.exponent || got->total_count != expected.total_count) {
    return "calibration: exponent or total_count differ from the histogram's";
  }
  return "";
}

// Runs one case; returns "" on success, else what differed. `final` receives the
// histogram the session ends with.
std::string RunCase(const HistogramCase& c, Mode mode, std::optional<Histogram>* final) {
  CalculatorOptions options;
  options.histogram = c.params;
  absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> calculator =
      absl::InternalError("not built");
  absl::StatusOr<NonFinitePolicy> policy =
      ParseNonFinitePolicy(c.nonfinite.value_or("reject"));  // the wire's enum check
  if (policy.ok()) {
    if (options.histogram) options.histogram->nonfinite = *policy;
    calculator = QParamsCalculatorRegistry::Global().CreateStateful(c.calculator, c.spec, options);
  } else {
    calculator = policy.status();
  }
  if (c.construct_error.has_value()) {
    if (calculator.ok()) {
      return absl::StrCat("construction: expected ", CodeName(*c.construct_error), ", got ok");
    }
    if (calculator.status().code() != *c.construct_error) {
      return absl::StrCat("construction: expected ", CodeName(*c.construct_error), ", got ",
                          calculator.status().ToString());
    }
    return "";
  }
  if (!calculator.ok()) {
    return absl::StrCat("construction failed: ", calculator.status().ToString());
  }
  auto* calc = dynamic_cast<HistogramQParamsCalculator*>(calculator->get());
  if (calc == nullptr) return absl::StrCat(c.calculator, " is not a histogram calculator");

  for (size_t i = 0; i < c.steps.size(); ++i) {
    const HistogramStep& step = c.steps[i];
    const std::string where = absl::StrCat("step ", i, " ");
    const CalculatorState before = calc->ExportState();
    absl::Status status;
    std::optional<QParams> result;

    switch (step.op) {
      case HistogramStep::Op::kForward:
      case HistogramStep::Op::kObserveHistogram: {
        absl::StatusOr<TensorView> view = absl::InternalError("unused");
        std::optional<Observation> observation;
        if (step.op == HistogramStep::Op::kForward) {
          view = TensorView::Create(step.input.dtype, step.input.shape, step.input.data);
          if (!view.ok()) return absl::StrCat(where, "bad input: ", view.status().ToString());
          observation = Observation::FromTensor(*view);
        } else {
          observation = Observation::FromHistogram(step.histogram);
        }
        if (mode == Mode::kForward) {
          absl::StatusOr<QParams> q = calc->Forward(*observation);
          status = q.status();
          if (q.ok()) result = *std::move(q);
        } else {
          status = calc->Observe(*observation);
          if (status.ok()) result = calc->GetQParams();
        }
        break;
      }
      case HistogramStep::Op::kGetQParams:
        result = calc->GetQParams();
        break;
      case HistogramStep::Op::kGetHistogram:
        if (step.expect_histogram.has_value()) {
          if (std::string d = HistogramDifference(*step.expect_histogram, calc->histogram());
              !d.empty()) {
            return absl::StrCat(where, "histogram ", d);
          }
        }
        break;
      case HistogramStep::Op::kSetExportMode:
        status = calc->SetExportMode(step.enabled);
        break;
      case HistogramStep::Op::kSetGranularity:
        status = calc->SetGranularity(step.granularity);
        break;
    }

    if (step.expect_error.has_value()) {
      if (std::string d = ErrorStepDifference(*step.expect_error, status,
                                              SameState(before, calc->ExportState()));
          !d.empty()) {
        return absl::StrCat(where, "(rule ", step.rule, ") ", d);
      }
      continue;
    }
    if (!status.ok()) return absl::StrCat(where, "status: expected ok, got ", status.ToString());
    if (step.expect.has_value()) {
      if (!result.has_value()) return absl::StrCat(where, "no qparams to compare");
      if (std::string d = FirstDifference(*step.expect, *result, calc->initialized()); !d.empty()) {
        return absl::StrCat(where, d);
      }
      if (std::string d = CalibrationDifference(*step.expect_calibration, *calc); !d.empty()) {
        return absl::StrCat(where, d);
      }
    }
  }
  *final = calc->histogram();
  return "";
}

TEST(HistogramConformance, EveryVectorMatchesBitForBit) {
  const std::string path = HistogramVectorsPath();
  absl::StatusOr<std::vector<HistogramCase>> cases = LoadHistogramVectors(path);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_FALSE(cases->empty()) << path << " holds no cases";

  int failed = 0;
  std::map<std::string, std::pair<std::string, Histogram>> groups;  // group -> first member
  for (const HistogramCase& c : *cases) {
    std::optional<Histogram> final;
    std::string diff;
    for (Mode mode : {Mode::kForward, Mode::kObserve}) {
      diff = RunCase(c, mode, &final);
      if (!diff.empty()) {
        diff = absl::StrCat(mode == Mode::kObserve ? "(observe, then get_qparams) " : "", diff);
        break;
      }
    }
    if (diff.empty() && !c.group.empty() && final.has_value()) {
      auto [it, first] = groups.try_emplace(c.group, c.id, *final);
      if (!first) {
        if (std::string d = HistogramDifference(it->second.second, *final); !d.empty()) {
          diff = absl::StrCat("group ", c.group, ": the histogram differs from that of ",
                              it->second.first, ": ", d);
        }
      }
    }
    if (diff.empty()) continue;
    ++failed;
    ADD_FAILURE() << "case " << c.id << ": " << diff;
  }
  std::cout << "histogram conformance: " << cases->size() - failed << " of " << cases->size()
            << " cases match\n";
}

}  // namespace
}  // namespace qparams::testing
