// A calculator's full state as a plain value, for persistence: restoring it gives a
// calculator whose every further step is bit-identical to the original's.

#ifndef QPARAMS_CORE_CALCULATOR_STATE_H_
#define QPARAMS_CORE_CALCULATOR_STATE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/histogram.h"
#include "core/histogram_params.h"
#include "core/qparams.h"
#include "core/quant_spec.h"

namespace qparams {

struct CalculatorState {
  std::string calculator;                    // registry key (never "default")
  QuantSpec spec;                            // resolved, with the current granularity
  std::optional<double> averaging_constant;  // moving_average only
  bool initialized = false;
  bool export_mode = false;  // stateful kinds
  DType compute_dtype_for_export = DType::kFloat32;
  int64_t observation_count = 0;        // stateful kinds: computing forwards applied
  QParams qparams;                      // stateful kinds: the buffers (empty for the
                                        // histogram kinds, which derive them)
  std::optional<WorkingRange> running;  // running kinds, once initialized
  // static, once initialized: the range of its last computing forward, which scale
  // groups read (nvfp4.md §4.2); unset in states written before it was kept.
  std::optional<WorkingRange> last_range;
  std::optional<HistogramParams> histogram_params;  // histogram kinds: resolved
  std::optional<Histogram> histogram;               // histogram kinds: canonical
};

}  // namespace qparams

#endif  // QPARAMS_CORE_CALCULATOR_STATE_H_
