// The QParamsCalculatorBase registry (semantics.md §8): calculator classes by key,
// with the upstream operations register, get_class, list_registry_keys/values and
// resolve, plus construction from a spec and from an exported state.

#ifndef QPARAMS_CORE_REGISTRY_H_
#define QPARAMS_CORE_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calculator_state.h"
#include "core/histogram_params.h"
#include "core/qparams_calculator.h"
#include "core/quant_spec.h"

namespace qparams {

// Constructor parameters beyond the spec.
struct CalculatorOptions {
  // moving_average only: finite, 0 < c <= 1; unset means 0.01.
  std::optional<double> averaging_constant;
  // percentile, entropy and mse only (histogram_params.h); unset means every default.
  // (Initialized, so that CalculatorOptions{c} needs no second member.)
  std::optional<HistogramParams> histogram = std::nullopt;
};

// One registered calculator class.
struct CalculatorClass {
  using Factory = std::function<absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>>(
      const QuantSpec& resolved_spec, const CalculatorOptions& options)>;
  using StatefulFactory =
      std::function<absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>>(
          const QuantSpec& resolved_spec, const CalculatorOptions& options)>;

  std::string key;
  bool stateful = true;
  std::string description;
  Factory create;  // validates the kind's own rules; "default" has none
  // The same construction with the stateful type, for a session's calculator; set
  // by StatefulClass, null for stateless classes.
  StatefulFactory create_stateful;
};

// A stateful class: `create` and `create_stateful` from one factory.
CalculatorClass StatefulClass(std::string key, std::string description,
                              CalculatorClass::StatefulFactory create);

class QParamsCalculatorRegistry {
 public:
  // The registry of QParamsCalculatorBase, holding the built-in classes static,
  // moving_average, global_minmax, dynamic, percentile, entropy, mse and the
  // "default" marker.
  static QParamsCalculatorRegistry& Global();

  QParamsCalculatorRegistry() = default;

  // register(key): adds `cls` under cls.key. A duplicate key is overwritten (the last
  // registration wins, as upstream); returns false in that case so the caller can warn.
  bool Register(CalculatorClass cls);

  // get_class(key): NOT_FOUND naming the key if nothing is registered under it.
  absl::StatusOr<const CalculatorClass*> GetClass(absl::string_view key) const;

  // list_registry_keys / list_registry_values, sorted by key.
  std::vector<std::string> ListRegistryKeys() const;
  std::vector<const CalculatorClass*> ListRegistryValues() const;

  // resolve(key): the registered class, or INVALID_ARGUMENT naming the key and
  // listing the available keys, sorted.
  absl::StatusOr<const CalculatorClass*> Resolve(absl::string_view key) const;

  // The concrete key: "default" (or "") resolves by target, weight -> static and
  // activation -> moving_average; other keys must be registered (INVALID_ARGUMENT).
  absl::StatusOr<std::string> ResolveKey(absl::string_view key, Target target) const;

  // Builds a calculator: resolves the key and the spec, then runs the class's
  // factory. INVALID_ARGUMENT naming the field for anything invalid.
  absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> Create(
      absl::string_view key, const QuantSpec& spec, const CalculatorOptions& options = {}) const;

  // As Create, with the stateful type a session holds: INVALID_ARGUMENT if the class
  // has no stateful factory.
  absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> CreateStateful(
      absl::string_view key, const QuantSpec& spec, const CalculatorOptions& options = {}) const;

 private:
  // The class of `key` (resolved as ResolveKey does) and the resolved spec.
  struct Resolved {
    const CalculatorClass* cls;
    QuantSpec spec;
  };
  absl::StatusOr<Resolved> ResolveForCreate(absl::string_view key, const QuantSpec& spec) const;

  std::map<std::string, CalculatorClass, std::less<>> classes_;
};

// Rebuilds a calculator from ExportState() output, through the global registry.
// INVALID_ARGUMENT if the state is inconsistent (sizes, flags, spec).
absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> CreateFromState(
    const CalculatorState& state);
// As CreateFromState, with the stateful type a session holds (INVALID_ARGUMENT for
// a stateless class's state).
absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> CreateStatefulFromState(
    const CalculatorState& state);

}  // namespace qparams

#endif  // QPARAMS_CORE_REGISTRY_H_
