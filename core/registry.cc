#include "core/registry.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/histogram_calculator.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

absl::Status RejectAveragingConstant(const CalculatorOptions& options, absl::string_view key) {
  if (!options.averaging_constant.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("averaging_constant is for moving_average only; leave it unset for ", key));
}

absl::Status RejectHistogramParams(const CalculatorOptions& options, absl::string_view key) {
  if (!options.histogram.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "histogram parameters are for percentile, entropy and mse only; leave them unset for ",
      key));
}

// The options of a kind that takes neither an averaging constant nor histogram
// parameters.
absl::Status RejectOptions(const CalculatorOptions& options, absl::string_view key) {
  QPARAMS_RETURN_IF_ERROR(RejectAveragingConstant(options, key));
  return RejectHistogramParams(options, key);
}

template <typename Calculator>
CalculatorClass::StatefulFactory PlainFactory(absl::string_view key) {
  return [key = std::string(key)](const QuantSpec& spec, const CalculatorOptions& options)
             -> absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> {
    QPARAMS_RETURN_IF_ERROR(RejectOptions(options, key));
    return std::make_unique<Calculator>(spec);
  };
}

absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> CreateMovingAverage(
    const QuantSpec& spec, const CalculatorOptions& options) {
  QPARAMS_RETURN_IF_ERROR(RejectHistogramParams(options, "moving_average"));
  const double c = options.averaging_constant.value_or(
      MovingAverageQParamsCalculator::kDefaultAveragingConstant);
  if (!std::isfinite(c) || c <= 0 || c > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("averaging_constant is ", c, "; it must be finite with 0 < c <= 1"));
  }
  return std::make_unique<MovingAverageQParamsCalculator>(spec, c);
}

absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> CreateDynamic(
    const QuantSpec& spec, const CalculatorOptions& options) {
  QPARAMS_RETURN_IF_ERROR(RejectOptions(options, "dynamic"));
  if (!spec.float_range.empty()) {
    return absl::InvalidArgumentError(
        "spec.float_range: the stateless dynamic calculator requires float_range=[None, None]");
  }
  if (spec.qscheme == QScheme::kSymmetricWithClipping) {
    return absl::InvalidArgumentError(
        "spec.qscheme: the dynamic calculator does not support SYMMETRIC_WITH_CLIPPING");
  }
  return std::make_unique<DynamicQParamsCalculator>(spec);
}

CalculatorClass::StatefulFactory HistogramFactory(absl::string_view key) {
  return [key = std::string(key)](const QuantSpec& spec, const CalculatorOptions& options)
             -> absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> {
    QPARAMS_RETURN_IF_ERROR(RejectAveragingConstant(options, key));
    absl::StatusOr<std::unique_ptr<HistogramQParamsCalculator>> c =
        HistogramQParamsCalculator::Create(key, spec, options.histogram.value_or(HistogramParams()));
    if (!c.ok()) return c.status();
    return std::unique_ptr<StatefulQParamsCalculatorBase>(*std::move(c));
  };
}

QParamsCalculatorRegistry MakeBuiltins() {
  QParamsCalculatorRegistry registry;
  registry.Register(StatefulClass("static", "qparams from the range of the current input only",
                                  PlainFactory<StaticQParamsCalculator>("static")));
  registry.Register(StatefulClass("moving_average",
                                  "qparams from an exponential moving average of the range "
                                  "(averaging_constant, default 0.01)",
                                  CreateMovingAverage));
  registry.Register(StatefulClass("global_minmax",
                                  "qparams from the running min of minima and max of maxima",
                                  PlainFactory<GlobalMinMaxQParamsCalculator>("global_minmax")));
  registry.Register(StatefulClass(
      "percentile",
      "per-tensor: the left edge of the histogram bin where |x| reaches the percentile "
      "(num_bins, percentile, skip_zeros, nonfinite)",
      HistogramFactory("percentile")));
  registry.Register(StatefulClass(
      "entropy",
      "per-tensor, integer dtypes: the histogram clipping of least KL divergence "
      "(num_bins, start_bin, stride, skip_zeros, nonfinite)",
      HistogramFactory("entropy")));
  registry.Register(StatefulClass(
      "mse",
      "per-tensor, integer dtypes: the histogram bin center whose qparams fake-quantize "
      "with least squared error (num_bins, start_bin, stride, skip_zeros, nonfinite)",
      HistogramFactory("mse")));
  registry.Register({"dynamic", false,
                     "stateless: recomputes qparams from each input; any shape and dtype",
                     CreateDynamic, nullptr});
  registry.Register({"default", true,
                     "resolved by target: static for weights, moving_average for activations",
                     nullptr, nullptr});
  return registry;
}

// The constructor options a state was built with.
CalculatorOptions OptionsOf(const CalculatorState& state) {
  CalculatorOptions options;
  options.averaging_constant = state.averaging_constant;
  options.histogram = state.histogram_params;
  return options;
}

absl::Status CheckResolvedKey(const CalculatorState& state) {
  if (state.calculator == "default") {
    return absl::InvalidArgumentError("state.calculator must be a resolved key, not default");
  }
  return absl::OkStatus();
}

}  // namespace

CalculatorClass StatefulClass(std::string key, std::string description,
                              CalculatorClass::StatefulFactory create) {
  CalculatorClass cls;
  cls.key = std::move(key);
  cls.stateful = true;
  cls.description = std::move(description);
  cls.create = [create](const QuantSpec& spec, const CalculatorOptions& options)
      -> absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> {
    absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> c = create(spec, options);
    if (!c.ok()) return c.status();
    return std::unique_ptr<QParamsCalculatorBase>(*std::move(c));
  };
  cls.create_stateful = std::move(create);
  return cls;
}

QParamsCalculatorRegistry& QParamsCalculatorRegistry::Global() {
  static QParamsCalculatorRegistry* registry = new QParamsCalculatorRegistry(MakeBuiltins());
  return *registry;
}

bool QParamsCalculatorRegistry::Register(CalculatorClass cls) {
  std::string key = cls.key;
  return classes_.insert_or_assign(std::move(key), std::move(cls)).second;
}

absl::StatusOr<const CalculatorClass*> QParamsCalculatorRegistry::GetClass(
    absl::string_view key) const {
  auto it = classes_.find(key);
  if (it == classes_.end()) {
    return absl::NotFoundError(absl::StrCat("no object registered under key \"", key,
                                            "\" in the QParamsCalculatorBase registry"));
  }
  return &it->second;
}

std::vector<std::string> QParamsCalculatorRegistry::ListRegistryKeys() const {
  std::vector<std::string> keys;
  for (const auto& [key, cls] : classes_) keys.push_back(key);
  return keys;
}

std::vector<const CalculatorClass*> QParamsCalculatorRegistry::ListRegistryValues() const {
  std::vector<const CalculatorClass*> values;
  for (const auto& [key, cls] : classes_) values.push_back(&cls);
  return values;
}

absl::StatusOr<const CalculatorClass*> QParamsCalculatorRegistry::Resolve(
    absl::string_view key) const {
  auto it = classes_.find(key);
  if (it == classes_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calculator \"", key, "\" is not registered in QParamsCalculatorBase; available: ",
        absl::StrJoin(ListRegistryKeys(), ", ")));
  }
  return &it->second;
}

absl::StatusOr<std::string> QParamsCalculatorRegistry::ResolveKey(absl::string_view key,
                                                                  Target target) const {
  if (key.empty() || key == "default") {
    return std::string(target == Target::kActivation ? "moving_average" : "static");
  }
  absl::StatusOr<const CalculatorClass*> cls = Resolve(key);
  if (!cls.ok()) return cls.status();
  return (*cls)->key;
}

absl::StatusOr<QParamsCalculatorRegistry::Resolved> QParamsCalculatorRegistry::ResolveForCreate(
    absl::string_view key, const QuantSpec& spec) const {
  QPARAMS_ASSIGN_OR_RETURN(const std::string resolved_key, ResolveKey(key, spec.target));
  QPARAMS_ASSIGN_OR_RETURN(const CalculatorClass* cls, Resolve(resolved_key));
  if (!cls->create) {
    return absl::InvalidArgumentError(
        absl::StrCat("calculator \"", resolved_key, "\" cannot be constructed"));
  }
  QPARAMS_ASSIGN_OR_RETURN(QuantSpec resolved_spec, spec.Resolve());
  return Resolved{cls, std::move(resolved_spec)};
}

absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> QParamsCalculatorRegistry::Create(
    absl::string_view key, const QuantSpec& spec, const CalculatorOptions& options) const {
  QPARAMS_ASSIGN_OR_RETURN(const Resolved resolved, ResolveForCreate(key, spec));
  return resolved.cls->create(resolved.spec, options);
}

absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>>
QParamsCalculatorRegistry::CreateStateful(absl::string_view key, const QuantSpec& spec,
                                          const CalculatorOptions& options) const {
  QPARAMS_ASSIGN_OR_RETURN(const Resolved resolved, ResolveForCreate(key, spec));
  if (!resolved.cls->create_stateful) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calculator \"", resolved.cls->key, "\" is stateless; a session needs a stateful one"));
  }
  return resolved.cls->create_stateful(resolved.spec, options);
}

absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> CreateFromState(
    const CalculatorState& state) {
  QPARAMS_RETURN_IF_ERROR(CheckResolvedKey(state));
  absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> calculator =
      QParamsCalculatorRegistry::Global().Create(state.calculator, state.spec, OptionsOf(state));
  if (!calculator.ok()) return calculator.status();
  QPARAMS_RETURN_IF_ERROR((*calculator)->RestoreState(state));
  return calculator;
}

absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> CreateStatefulFromState(
    const CalculatorState& state) {
  QPARAMS_RETURN_IF_ERROR(CheckResolvedKey(state));
  absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> calculator =
      QParamsCalculatorRegistry::Global().CreateStateful(state.calculator, state.spec,
                                                         OptionsOf(state));
  if (!calculator.ok()) return calculator.status();
  // RestoreState is the base's, open to this friend of the base.
  QParamsCalculatorBase& base = **calculator;
  QPARAMS_RETURN_IF_ERROR(base.RestoreState(state));
  return calculator;
}

}  // namespace qparams
