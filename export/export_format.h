// The deployment formats sessions export to (docs/exports.md):
// the rule that names a session's tensor, what each format can express, and the
// JSON each format holds for one session. The one implementation of every format:
// clients receive the rendered bytes and never re-render.
//
// Pure functions of their arguments; thread-safe.

#ifndef QPARAMS_EXPORT_EXPORT_FORMAT_H_
#define QPARAMS_EXPORT_EXPORT_FORMAT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/granularity.h"
#include "domain/session.h"

namespace qparams {

enum class ExportFormat {
  kAimet,              // AIMET encodings 1.0.0
  kOnnx,               // QuantizeLinear inputs, the layout of AIMET encodings 2.0.0
  kCompressedTensors,  // compressed-tensors' scale tensors and quantization_config
  kModelOpt,           // ModelOpt's NVFP4 scale tensors and hf_quant_config.json
};

// "aimet", "onnx", "compressed-tensors" or "modelopt". INVALID_ARGUMENT naming
// `format` and the allowed names otherwise.
absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name);

enum class TensorRole { kWeight, kInput, kOutput };

// "weight", "input", "output": compressed-tensors' prefix of the role's tensors.
absl::string_view RoleName(TensorRole role);

// Where a session sits in a model.
struct TensorBinding {
  // The session name without the export's prefix and then one leading '/' or '.'
  // (the whole name when that leaves nothing), and without its hash tag's braces.
  std::string tensor;
  // kWeight for target WEIGHT. For ACTIVATION, kOutput when the tensor name ends in
  // ".output" or ".activation_post_process" (torch.ao's observer of a module's
  // output), else kInput.
  TensorRole role = TensorRole::kWeight;
  // The tensor name without a trailing ".weight", ".input", ".output" or
  // ".activation_post_process": the module compressed-tensors names tensors after.
  std::string module;
};

// The binding of the session `session_name`, which starts with `prefix`. When
// `renames` holds the tensor name, its value replaces it (and the module is taken
// from the new name); the role still comes from the session's own name. Otherwise
// the braces of a hash tag are dropped (common/slot.h WithoutHashTagBraces): a
// session named "{model.layers.0.self_attn}.q_proj.weight" for placement exports as
// "model.layers.0.self_attn.q_proj.weight".
TensorBinding BindTensor(absl::string_view session_name, absl::string_view prefix, Target target,
                         const std::map<std::string, std::string>& renames = {});

// The shortest decimal that reads back as `value` (std::to_chars): how every format
// writes a float32.
std::string FloatText(float value);

// The session's scales are NVFP4's two levels (a resolved spec with scale_dtype
// float8_e4m3fn): e4m3 block bytes and a global scale.
bool IsNvfp4(const SessionInfo& session);

// One initialized session in `format`:
// - kAimet: one encoding object (for activation_encodings or param_encodings, as the
//   role says);
// - kOnnx: one entry of "encodings";
// - kCompressedTensors: the members of "tensors" (`"<module>.<role>_scale": {...}`
//   and, for integer dtypes, `..._zero_point`; for NVFP4 (nvfp4.md section 6) a
//   weight's `_weight_scale` e4m3 bytes and `_weight_global_scale`, an input's
//   `_input_global_scale`), comma-separated;
// - kModelOpt (NVFP4 only): a weight's `_weight_scale` e4m3 bytes and
//   `_weight_scale_2`, an input's `_input_scale`.
// A tensor member is `"name": {"dtype", "shape", "data"}`; float8_e4m3fn data are
// the byte values (docs/exports.md). `indent` starts every line after the first.
// INVALID_ARGUMENT "session NAME: ..." naming what the format cannot express (for
// NVFP4: a convention other than the format's, naming the format to use; a layout
// other than a 2-D weight in blocks of 16 along its last axis; an output activation).
absl::StatusOr<std::string> RenderSession(ExportFormat format, const SessionInfo& session,
                                          const TensorBinding& binding, absl::string_view indent);

// compressed-tensors' QuantizationArgs of an initialized session, as a JSON object
// (NVFP4: section 6's tensor_group args, input activations dynamic "local"); sessions
// with equal args share a config group. INVALID_ARGUMENT as RenderSession.
absl::StatusOr<std::string> CompressedTensorsArgs(const SessionInfo& session,
                                                  const TensorBinding& binding);

}  // namespace qparams

#endif  // QPARAMS_EXPORT_EXPORT_FORMAT_H_
