// Runs every case of the conformance vectors (VectorsPath()) through the core
// calculators and fails on any difference, naming the case, step and field. Each
// case runs twice: with whole tensors, and with block ranges reduced beforehand
// (ObserveRange, as a client does) wherever the input can be reduced.

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/registry.h"
#include "gtest/gtest.h"
#include "tests/conformance_vectors.h"
#include "tests/test_util.h"

namespace qparams::testing {
namespace {

enum class Mode { kTensor, kRange };

// Runs one case; returns "" on success, else what differed.
std::string RunCase(const VectorCase& c, Mode mode) {
  CalculatorOptions options{c.averaging_constant};
  auto calculator = QParamsCalculatorRegistry::Global().Create(c.calculator, c.spec, options);
  if (c.construct_error.has_value()) {
    if (calculator.ok())
      return absl::StrCat("construction: expected ", CodeName(*c.construct_error), ", got ok");
    if (calculator.status().code() != *c.construct_error) {
      return absl::StrCat("construction: expected ", CodeName(*c.construct_error), ", got ",
                          calculator.status().ToString());
    }
    return "";
  }
  if (!calculator.ok())
    return absl::StrCat("construction failed: ", calculator.status().ToString());
  QParamsCalculatorBase& calc = **calculator;

  for (size_t i = 0; i < c.steps.size(); ++i) {
    const VectorStep& step = c.steps[i];
    const std::string where = absl::StrCat("step ", i, " ");
    const CalculatorState before = calc.ExportState();
    absl::Status status;
    std::optional<QParams> result;
    std::optional<bool> initialized;

    switch (step.op) {
      case VectorStep::Op::kForward: {
        absl::StatusOr<TensorView> view =
            TensorView::Create(step.input.dtype, step.input.shape, step.input.data);
        if (!view.ok()) return absl::StrCat(where, "bad input tensor: ", view.status().ToString());
        Observation observation = Observation::FromTensor(*view);
        BlockRange reduced;  // outlives `observation` when it is a range observation
        if (mode == Mode::kRange) {
          absl::StatusOr<Shape> block =
              calc.spec().granularity.BlockShape(view->shape(), calc.spec().target);
          absl::StatusOr<BlockRange> range =
              block.ok() ? ObserveRange(*view, *block) : block.status();
          if (range.ok()) {
            reduced = std::move(*range);
            observation =
                Observation::FromRange(view->shape(), reduced.min.view(), reduced.max.view());
          }
        }
        absl::StatusOr<QParams> q = calc.Forward(observation);
        status = q.status();
        if (q.ok()) result = std::move(*q);
        break;
      }
      case VectorStep::Op::kGetQParams: {
        auto* stateful = dynamic_cast<StatefulQParamsCalculatorBase*>(&calc);
        if (stateful == nullptr)
          return absl::StrCat(where, "get_qparams on a stateless calculator");
        result = stateful->GetQParams();
        initialized = stateful->initialized();
        break;
      }
      case VectorStep::Op::kSetExportMode:
        status = calc.SetExportMode(step.enabled);
        break;
      case VectorStep::Op::kSetGranularity:
        status = calc.SetGranularity(step.granularity);
        break;
    }

    if (step.expect_error.has_value()) {
      if (std::string d = ErrorStepDifference(*step.expect_error, status,
                                              SameState(before, calc.ExportState()));
          !d.empty()) {
        return absl::StrCat(where, d);
      }
      continue;
    }
    if (!status.ok()) return absl::StrCat(where, "status: expected ok, got ", status.ToString());
    if (step.expect.has_value()) {
      if (!result.has_value()) return absl::StrCat(where, "no qparams to compare");
      if (std::string d = FirstDifference(*step.expect, *result, initialized); !d.empty()) {
        return absl::StrCat(where, d);
      }
    }
  }
  return "";
}

TEST(Conformance, EveryVectorMatchesBitForBit) {
  const std::string path = VectorsPath();
  absl::StatusOr<std::vector<VectorCase>> cases = LoadVectors(path);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_FALSE(cases->empty()) << path << " holds no cases";

  int failed = 0;
  for (const VectorCase& c : *cases) {
    for (Mode mode : {Mode::kTensor, Mode::kRange}) {
      const std::string diff = RunCase(c, mode);
      if (diff.empty()) continue;
      ++failed;
      ADD_FAILURE() << "case " << c.id << (mode == Mode::kRange ? " (range observations)" : "")
                    << ": " << diff;
      break;
    }
  }
  std::cout << "conformance: " << cases->size() - failed << " of " << cases->size()
            << " cases match (" << path << ")\n";
}

}  // namespace
}  // namespace qparams::testing
