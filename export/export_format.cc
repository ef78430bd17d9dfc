#include "export/export_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_string.h"
#include "common/slot.h"
#include "core/dtype.h"
#include "core/quant_spec.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

constexpr absl::string_view kOutputSuffixes[] = {".output", ".activation_post_process"};
constexpr absl::string_view kRoleSuffixes[] = {".weight", ".input", ".output",
                                               ".activation_post_process"};

// The shortest decimal that reads back as the same float (std::to_chars' guarantee).
void AppendFloat(std::string* out, float value) {
  char buffer[32];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, result.ptr);
}

template <typename T, typename Append>
void AppendList(std::string* out, const std::vector<T>& values, Append append) {
  out->push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out->append(", ");
    append(out, values[i]);
  }
  out->push_back(']');
}

void AppendInt(std::string* out, int64_t value) { absl::StrAppend(out, value); }

// `values` (row-major, `shape`) as nested lists, one level per dim.
template <typename T, typename Append>
void AppendNested(std::string* out, const std::vector<T>& values, const Shape& shape, size_t dim,
                  size_t* next, Append append) {
  out->push_back('[');
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (i > 0) out->append(", ");
    if (dim + 1 == shape.size()) {
      append(out, values[(*next)++]);
    } else {
      AppendNested(out, values, shape, dim + 1, next, append);
    }
  }
  out->push_back(']');
}

absl::Status Refuse(const SessionInfo& session, absl::string_view format,
                    absl::string_view reason) {
  return absl::InvalidArgumentError(
      absl::StrCat("session ", session.name, ": ", format, " cannot express it: ", reason));
}

// How a session's qparams lie over its tensor, in the terms the formats use.
struct Layout {
  enum class Kind {
    kTensor,   // one scale
    kChannel,  // one scale per index of `axis`
    kBlock,    // blocks of `block_size` along `axis`, one scale per element elsewhere
    kOther,    // blocks over several axes, or whole trailing dims
  };
  Kind kind = Kind::kTensor;
  int axis = 0;
  int64_t block_size = 0;
  // kOther on a rank-2 tensor with positive sizes on both axes: those sizes.
  std::optional<std::vector<int64_t>> block_2d;
};

Layout LayoutOf(const SessionInfo& session) {
  const Granularity& granularity = session.spec.granularity;
  const int rank = static_cast<int>(session.qparams.shape.size());
  auto normalize = [rank](int64_t axis) { return static_cast<int>(axis < 0 ? axis + rank : axis); };
  Layout layout;
  switch (granularity.kind()) {
    case Granularity::Kind::kPerTensor:
      return layout;
    case Granularity::Kind::kPerChannel:
      layout.kind = Layout::Kind::kChannel;
      layout.axis = normalize(*granularity.axis());
      return layout;
    case Granularity::Kind::kPerBlock:
      break;
  }
  const std::vector<int64_t>& sizes = granularity.block_size();
  if (granularity.axis().has_value()) {
    // Single-axis (semantics.md §3.3): every other axis is per element for
    // activations, and for weights only the two leading axes are, the rest whole.
    const int64_t size = sizes.size() == 1 ? sizes[0] : 0;
    if (session.spec.target == Target::kActivation || rank <= 2) {
      layout.kind = Layout::Kind::kBlock;
      layout.axis = normalize(*granularity.axis());
      layout.block_size = size;
    } else {
      layout.kind = Layout::Kind::kOther;
    }
    return layout;
  }
  // Multi-axis: sizes of 1 are per element, -1 a whole axis.
  int blocked = -1;
  int non_unit = 0;
  for (int d = 0; d < static_cast<int>(sizes.size()); ++d) {
    if (sizes[d] == 1) continue;
    ++non_unit;
    blocked = d;
  }
  if (non_unit == 1 && sizes[blocked] > 0) {
    layout.kind = Layout::Kind::kBlock;
    layout.axis = blocked;
    layout.block_size = sizes[blocked];
    return layout;
  }
  layout.kind = Layout::Kind::kOther;
  if (sizes.size() == 2 && sizes[0] > 0 && sizes[1] > 0) layout.block_2d = sizes;
  return layout;
}

// The session's quantized dtype; resolved specs always parse.
QuantDType DTypeOf(const SessionInfo& session) { return *ParseQuantDType(session.spec.dtype); }

double QuantMin(const SessionInfo& session) { return session.spec.quant_min.value_or(0); }
double QuantMax(const SessionInfo& session) { return session.spec.quant_max.value_or(0); }

std::string RangeText(double lo, double hi) { return absl::StrCat("[", lo, ", ", hi, "]"); }

absl::string_view FormatName(ExportFormat format) {
  switch (format) {
    case ExportFormat::kAimet:
      return "AIMET encodings 1.0.0";
    case ExportFormat::kOnnx:
      return "ONNX QuantizeLinear";
    case ExportFormat::kCompressedTensors:
      return "compressed-tensors";
    case ExportFormat::kModelOpt:
      return "ModelOpt";
  }
  return "";
}

// What no format holds: a non-finite scale (JSON has no Inf; a range wider than
// float32's largest value overflows to one), and a zero point outside the quant range
// (which a computation from finite data never gives).
absl::Status CheckValues(const SessionInfo& session, absl::string_view format) {
  const QParams& q = session.qparams;
  for (size_t i = 0; i < q.scale.size(); ++i) {
    if (!std::isfinite(q.scale[i])) {
      return Refuse(session, format,
                    absl::StrCat("its scale ", i, " is ", q.scale[i],
                                 " (the observed range overflows float32), which JSON cannot "
                                 "hold"));
    }
  }
  for (size_t i = 0; i < q.zero_point.size(); ++i) {
    if (q.zero_point[i] < QuantMin(session) || q.zero_point[i] > QuantMax(session)) {
      return Refuse(
          session, format,
          absl::StrCat("its zero point ", i, " is ", q.zero_point[i], ", outside its quant range ",
                       RangeText(QuantMin(session), QuantMax(session))));
    }
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------ aimet

absl::StatusOr<std::string> RenderAimet(const SessionInfo& session, const TensorBinding& binding) {
  const absl::string_view format_name = FormatName(ExportFormat::kAimet);
  const QuantDType dtype = DTypeOf(session);
  if (dtype.is_floating_point()) {
    return Refuse(session, format_name,
                  absl::StrCat(dtype.name,
                               " is floating point, which 1.0.0 encodes only as FLOAT 16/32 "
                               "without a scale (use --format=onnx)"));
  }
  if (session.spec.e8m0_scale()) {
    return Refuse(session, format_name,
                  "its scales are e8m0 (powers of two), which 1.0.0 has no "
                  "encoding for (use --format=onnx)");
  }
  const double levels = std::ldexp(1.0, dtype.bits);
  if (QuantMax(session) - QuantMin(session) != levels - 1) {
    return Refuse(session, format_name,
                  absl::StrCat("its quant range ", RangeText(QuantMin(session), QuantMax(session)),
                               " has fewer than the 2^", dtype.bits, " = ", levels,
                               " levels AIMET quantizes onto"));
  }
  const Layout layout = LayoutOf(session);
  absl::string_view enc_type;
  switch (layout.kind) {
    case Layout::Kind::kTensor:
      enc_type = "PER_TENSOR";
      break;
    case Layout::Kind::kChannel:
      if (layout.axis != 0) {
        return Refuse(session, format_name,
                      absl::StrCat("it is per channel along axis ", layout.axis,
                                   ", and 1.0.0 records no axis (its runtimes take axis 0; "
                                   "use --format=onnx)"));
      }
      enc_type = "PER_CHANNEL";
      break;
    case Layout::Kind::kBlock:
      if (layout.axis != 1 || session.qparams.shape.size() != 2) {
        return Refuse(session, format_name,
                      "1.0.0's PER_BLOCK is blocks along axis 1 of a 2-D weight, one row of "
                      "blocks per channel of axis 0");
      }
      enc_type = "PER_BLOCK";
      break;
    case Layout::Kind::kOther:
      return Refuse(session, format_name,
                    absl::StrCat("its granularity ", session.spec.granularity.ToString(),
                                 " blocks more than one axis"));
  }
  const QParams& q = session.qparams;
  std::vector<int64_t> offsets(q.scale.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    // AIMET: q = clamp(round(x / scale) - offset, 0, 2^bw - 1), x = (q + offset) * scale.
    const int64_t zero_point = q.has_zero_point ? q.zero_point[i] : 0;
    offsets[i] = static_cast<int64_t>(QuantMin(session)) - zero_point;
  }
  std::string out = "{\"name\": ";
  AppendJsonString(&out, binding.tensor);
  absl::StrAppend(&out, ", \"dtype\": \"INT\", \"enc_type\": \"", enc_type,
                  "\", \"bw\": ", dtype.bits,
                  ", \"is_sym\": ", session.spec.qscheme == QScheme::kAsymmetric ? "false" : "true",
                  ", \"scale\": ");
  AppendList(&out, q.scale, AppendFloat);
  out.append(", \"offset\": ");
  AppendList(&out, offsets, AppendInt);
  if (layout.kind == Layout::Kind::kBlock) {
    absl::StrAppend(&out, ", \"block_size\": ", layout.block_size);
  }
  out.push_back('}');
  return out;
}

// ------------------------------------------------------------------------ onnx

std::optional<absl::string_view> OnnxTypeName(const QuantDType& dtype) {
  if (dtype.name == "float8_e4m3fn") return "float8e4m3fn";
  if (dtype.name == "float8_e5m2") return "float8e5m2";
  if (dtype.name == "float4_e2m1fn_x2") return "float4e2m1";
  if (dtype.is_floating_point()) return std::nullopt;
  if (dtype.bits != 2 && dtype.bits != 4 && dtype.bits != 8) return std::nullopt;
  return dtype.name;  // int8, uint8, int4, uint4, int2, uint2: ONNX's own names
}

absl::StatusOr<std::string> RenderOnnx(const SessionInfo& session, const TensorBinding& binding) {
  const absl::string_view format_name = FormatName(ExportFormat::kOnnx);
  if (IsNvfp4(session)) {
    return Refuse(session, format_name,
                  "its NVFP4 scales have two levels (e4m3 blocks and a global scale), and "
                  "QuantizeLinear's y_scale has one (use --format=compressed-tensors or "
                  "--format=modelopt)");
  }
  const QuantDType dtype = DTypeOf(session);
  const std::optional<absl::string_view> type = OnnxTypeName(dtype);
  if (!type.has_value()) {
    return Refuse(session, format_name,
                  absl::StrCat(dtype.name,
                               " has no ONNX type (integers of 2, 4 or 8 bits, "
                               "float8e4m3fn, float8e5m2, float4e2m1)"));
  }
  if (!dtype.is_floating_point() &&
      (QuantMin(session) != dtype.min_value() || QuantMax(session) != dtype.max_value())) {
    return Refuse(session, format_name,
                  absl::StrCat("its quant range ", RangeText(QuantMin(session), QuantMax(session)),
                               " is not ", dtype.name, "'s whole range ",
                               RangeText(dtype.min_value(), dtype.max_value()),
                               ", to which QuantizeLinear saturates"));
  }
  const Layout layout = LayoutOf(session);
  if (layout.kind == Layout::Kind::kOther) {
    return Refuse(session, format_name,
                  absl::StrCat("its granularity ", session.spec.granularity.ToString(),
                               " is not blocks along one axis with one scale per element of "
                               "every other"));
  }
  const QParams& q = session.qparams;
  std::string out = "{\"name\": ";
  AppendJsonString(&out, binding.tensor);
  absl::StrAppend(&out, ", \"output_dtype\": \"", *type, "\", \"y_scale\": ");
  auto append_values = [&](const auto& values, auto append) {
    if (layout.kind == Layout::Kind::kTensor) {
      append(&out, values[0]);
    } else if (layout.kind == Layout::Kind::kChannel) {
      AppendList(&out, values, append);
    } else {
      size_t next = 0;
      AppendNested(&out, values, q.shape, 0, &next, append);
    }
  };
  append_values(q.scale, AppendFloat);
  if (q.has_zero_point) {
    out.append(", \"y_zero_point\": ");
    append_values(q.zero_point, AppendInt);
  }
  if (layout.kind != Layout::Kind::kTensor) absl::StrAppend(&out, ", \"axis\": ", layout.axis);
  if (layout.kind == Layout::Kind::kBlock) {
    absl::StrAppend(&out, ", \"block_size\": ", layout.block_size);
  }
  out.push_back('}');
  return out;
}

// ------------------------------------------------------------ compressed-tensors

// The shape compressed-tensors gives a scale, and the args' strategy.
struct CompressedTensorsLayout {
  std::vector<int64_t> shape;
  std::string strategy;
  std::optional<int64_t> group_size;
  std::optional<std::vector<int64_t>> block_structure;
};

absl::StatusOr<CompressedTensorsLayout> CompressedTensorsLayoutOf(const SessionInfo& session,
                                                                  const TensorBinding& binding) {
  const absl::string_view format_name = FormatName(ExportFormat::kCompressedTensors);
  const QuantDType dtype = DTypeOf(session);
  if (session.spec.e8m0_scale()) {
    return Refuse(session, format_name, "its scales are e8m0 (powers of two)");
  }
  if (dtype.name == "float8_e5m2") {
    return Refuse(session, format_name, "its 8-bit float type is e4m3 only, not float8_e5m2");
  }
  if (!dtype.is_floating_point()) {
    const double levels = std::ldexp(1.0, dtype.bits);
    if (QuantMax(session) - QuantMin(session) != levels - 1 ||
        (QuantMin(session) != 0 && QuantMin(session) != -levels / 2)) {
      return Refuse(
          session, format_name,
          absl::StrCat("its quant range ", RangeText(QuantMin(session), QuantMax(session)),
                       " is not ", dtype.name, "'s whole range ",
                       RangeText(dtype.min_value(), dtype.max_value())));
    }
  }
  const Layout layout = LayoutOf(session);
  const Shape& n = session.qparams.shape;
  CompressedTensorsLayout out;
  if (layout.kind == Layout::Kind::kTensor) {
    out.shape = {1};
    out.strategy = "tensor";
    return out;
  }
  if (binding.role != TensorRole::kWeight) {
    return Refuse(session, format_name,
                  absl::StrCat("it quantizes activations per tensor (static) or per token "
                               "(dynamic), not ",
                               session.spec.granularity.ToString()));
  }
  if (layout.kind == Layout::Kind::kChannel) {
    if (layout.axis != 0) {
      return Refuse(
          session, format_name,
          absl::StrCat("its channels are axis 0 (output features), not axis ", layout.axis));
    }
    out.shape = {n[0], 1};
    out.strategy = "channel";
    return out;
  }
  if (layout.kind == Layout::Kind::kBlock && layout.axis == 1 && n.size() == 2) {
    out.shape = {n[0], n[1]};
    out.strategy = "group";
    out.group_size = layout.block_size;
    return out;
  }
  if (layout.block_2d.has_value()) {
    out.shape = {n[0], n[1]};
    out.strategy = "block";
    out.block_structure = layout.block_2d;
    return out;
  }
  return Refuse(session, format_name,
                absl::StrCat("its granularity ", session.spec.granularity.ToString(),
                             " is not groups along axis 1 of a 2-D weight or 2-D blocks"));
}

void AppendTensor(std::string* out, absl::string_view name, absl::string_view dtype,
                  const std::vector<int64_t>& shape, absl::FunctionRef<void(std::string*)> data) {
  AppendJsonString(out, name);
  absl::StrAppend(out, ": {\"dtype\": \"", dtype, "\", \"shape\": ");
  AppendList(out, shape, AppendInt);
  out->append(", \"data\": ");
  data(out);
  out->push_back('}');
}

// ------------------------------------------------------------------------ nvfp4

// The convention each NVFP4 format's scales follow (nvfp4.md section 6).
absl::string_view ConventionOf(ExportFormat format) {
  return format == ExportFormat::kModelOpt ? "modelopt" : "compressed_tensors";
}

// What both NVFP4 checkpoint formats require of a session: the format's convention,
// and for a weight a 2-D [out, in] in blocks of 16 along its last axis (its scale
// shape [out, in/16]). Activations' block scales are dynamic at run time: only their
// global scale is exported, whatever their blocks.
absl::Status CheckNvfp4(ExportFormat format, const SessionInfo& session,
                        const TensorBinding& binding) {
  const absl::string_view format_name = FormatName(format);
  const absl::string_view wanted = ConventionOf(format);
  if (session.spec.convention != wanted) {
    return Refuse(
        session, format_name,
        absl::StrCat("its NVFP4 convention is ", session.spec.convention, ", and ", format_name,
                     " checkpoints hold the scales of convention ", wanted, " (export it with --format=",
                     format == ExportFormat::kModelOpt ? "compressed-tensors" : "modelopt",
                     ", or calibrate a session of convention ", wanted, ")"));
  }
  if (binding.role == TensorRole::kOutput) {
    return Refuse(session, format_name,
                  "its NVFP4 scheme quantizes weights and input activations, not a module's "
                  "output");
  }
  const QParams& q = session.qparams;
  if (!q.global_scale.has_value() || !std::isfinite(*q.global_scale)) {
    return Refuse(session, format_name, "it has no finite global scale");
  }
  if (binding.role == TensorRole::kInput) return absl::OkStatus();
  const Layout layout = LayoutOf(session);
  if (layout.kind != Layout::Kind::kBlock || q.shape.size() != 2 || layout.axis != 1 ||
      layout.block_size != 16) {
    return Refuse(session, format_name,
                  absl::StrCat("its NVFP4 weight checkpoint is a 2-D weight [out, in] in blocks "
                               "of 16 along the last axis (per_block:-1:16), not ",
                               session.spec.granularity.ToString(), " with scales of shape [",
                               absl::StrJoin(q.shape, ", "), "]"));
  }
  if (q.scale_e4m3.size() != static_cast<size_t>(q.shape[0] * q.shape[1])) {
    return Refuse(session, format_name,
                  absl::StrCat("it has ", q.scale_e4m3.size(), " e4m3 block scales for ",
                               q.shape[0] * q.shape[1], " blocks"));
  }
  return absl::OkStatus();
}

void AppendByte(std::string* out, uint8_t value) { absl::StrAppend(out, value); }

// Both NVFP4 forms: the weight's e4m3 block bytes and its global scale, or an input's
// global scale, under each format's names and shapes.
absl::StatusOr<std::string> RenderNvfp4(ExportFormat format, const SessionInfo& session,
                                        const TensorBinding& binding, absl::string_view indent) {
  QPARAMS_RETURN_IF_ERROR(CheckNvfp4(format, session, binding));
  const QParams& q = session.qparams;
  const bool modelopt = format == ExportFormat::kModelOpt;
  // compressed-tensors' global scales are [1]; ModelOpt's are scalars.
  const std::vector<int64_t> global_shape = modelopt ? std::vector<int64_t>{}
                                                     : std::vector<int64_t>{1};
  auto global = [&](std::string* o) { AppendList(o, std::vector<float>{*q.global_scale}, AppendFloat); };
  std::string out;
  if (binding.role == TensorRole::kInput) {
    AppendTensor(&out, absl::StrCat(binding.module, modelopt ? ".input_scale" : ".input_global_scale"),
                 "float32", global_shape, global);
    return out;
  }
  AppendTensor(&out, absl::StrCat(binding.module, ".weight_scale"), kE4M3ScaleDType,
               {q.shape[0], q.shape[1]},
               [&](std::string* o) { AppendList(o, q.scale_e4m3, AppendByte); });
  absl::StrAppend(&out, ",\n", indent);
  AppendTensor(&out,
               absl::StrCat(binding.module, modelopt ? ".weight_scale_2" : ".weight_global_scale"),
               "float32", global_shape, global);
  return out;
}

absl::StatusOr<std::string> RenderModelOpt(const SessionInfo& session, const TensorBinding& binding,
                                           absl::string_view indent) {
  if (!IsNvfp4(session)) {
    return Refuse(session, FormatName(ExportFormat::kModelOpt),
                  absl::StrCat("its scales are not NVFP4's (", session.spec.dtype,
                               session.spec.scale_dtype.empty() ? "" : " with scale_dtype ",
                               session.spec.scale_dtype,
                               "); the format holds float4_e2m1fn_x2 sessions with scale_dtype "
                               "float8_e4m3fn and convention modelopt only (export the others "
                               "with --format=compressed-tensors or --format=onnx)"));
  }
  return RenderNvfp4(ExportFormat::kModelOpt, session, binding, indent);
}

absl::StatusOr<std::string> RenderCompressedTensors(const SessionInfo& session,
                                                    const TensorBinding& binding,
                                                    absl::string_view indent) {
  if (IsNvfp4(session)) {
    return RenderNvfp4(ExportFormat::kCompressedTensors, session, binding, indent);
  }
  QPARAMS_ASSIGN_OR_RETURN(const CompressedTensorsLayout layout,
                           CompressedTensorsLayoutOf(session, binding));
  const QParams& q = session.qparams;
  const std::string stem = absl::StrCat(binding.module, ".", RoleName(binding.role));
  std::string out;
  AppendTensor(&out, absl::StrCat(stem, "_scale"), "float32", layout.shape,
               [&](std::string* o) { AppendList(o, q.scale, AppendFloat); });
  if (q.has_zero_point) {
    // compressed-tensors' integers are signed, [-2^(b-1), 2^(b-1) - 1]: an unsigned
    // grid's zero point moves with it (the dequantized values stay the same).
    const QuantDType dtype = DTypeOf(session);
    const int64_t shift =
        static_cast<int64_t>(-std::ldexp(1.0, dtype.bits - 1) - QuantMin(session));
    std::vector<int64_t> zero_points(q.zero_point.begin(), q.zero_point.end());
    for (int64_t& z : zero_points) z += shift;
    absl::StrAppend(&out, ",\n", indent);
    AppendTensor(&out, absl::StrCat(stem, "_zero_point"), "int8", layout.shape,
                 [&](std::string* o) { AppendList(o, zero_points, AppendInt); });
  }
  return out;
}


}  // namespace

absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name) {
  if (name == "aimet") return ExportFormat::kAimet;
  if (name == "onnx") return ExportFormat::kOnnx;
  if (name == "compressed-tensors") return ExportFormat::kCompressedTensors;
  if (name == "modelopt") return ExportFormat::kModelOpt;
  return absl::InvalidArgumentError(
      absl::StrCat("format: \"", name,
                   "\" is not an export format; use aimet, onnx, compressed-tensors or modelopt"));
}

std::string FloatText(float value) {
  std::string text;
  AppendFloat(&text, value);
  return text;
}

bool IsNvfp4(const SessionInfo& session) { return session.spec.nvfp4_scale(); }

absl::string_view RoleName(TensorRole role) {
  switch (role) {
    case TensorRole::kWeight:
      return "weight";
    case TensorRole::kInput:
      return "input";
    case TensorRole::kOutput:
      return "output";
  }
  return "";
}

TensorBinding BindTensor(absl::string_view session_name, absl::string_view prefix, Target target,
                         const std::map<std::string, std::string>& renames) {
  absl::string_view tensor = session_name;
  if (absl::StartsWith(tensor, prefix)) tensor.remove_prefix(prefix.size());
  if (!tensor.empty() && (tensor[0] == '/' || tensor[0] == '.')) tensor.remove_prefix(1);
  if (tensor.empty()) tensor = session_name;

  TensorBinding binding;
  binding.tensor = std::string(tensor);
  if (target == Target::kActivation) {
    binding.role = TensorRole::kInput;
    for (absl::string_view suffix : kOutputSuffixes) {
      if (absl::EndsWith(tensor, suffix)) binding.role = TensorRole::kOutput;
    }
  }
  if (auto renamed = renames.find(binding.tensor); renamed != renames.end()) {
    binding.tensor = renamed->second;
  } else {
    binding.tensor = WithoutHashTagBraces(binding.tensor);
  }
  tensor = binding.tensor;
  absl::string_view module = tensor;
  for (absl::string_view suffix : kRoleSuffixes) {
    if (module.size() > suffix.size() && absl::EndsWith(module, suffix)) {
      module.remove_suffix(suffix.size());
      break;
    }
  }
  binding.module = std::string(module);
  return binding;
}

absl::StatusOr<std::string> RenderSession(ExportFormat format, const SessionInfo& session,
                                          const TensorBinding& binding, absl::string_view indent) {
  QPARAMS_RETURN_IF_ERROR(CheckValues(session, FormatName(format)));
  switch (format) {
    case ExportFormat::kAimet:
      return RenderAimet(session, binding);
    case ExportFormat::kOnnx:
      return RenderOnnx(session, binding);
    case ExportFormat::kCompressedTensors:
      return RenderCompressedTensors(session, binding, indent);
    case ExportFormat::kModelOpt:
      return RenderModelOpt(session, binding, indent);
  }
  return absl::InternalError("unknown export format");
}

absl::StatusOr<std::string> CompressedTensorsArgs(const SessionInfo& session,
                                                  const TensorBinding& binding) {
  if (IsNvfp4(session)) {
    QPARAMS_RETURN_IF_ERROR(CheckNvfp4(ExportFormat::kCompressedTensors, session, binding));
    // The NVFP4 preset (quant_scheme.py); scale_dtype as compressed-tensors serializes a
    // torch dtype. Input block scales are computed per block at run time ("local").
    return absl::StrCat(
        "{\"num_bits\": 4, \"type\": \"float\", \"symmetric\": true, \"strategy\": "
        "\"tensor_group\", \"group_size\": 16, \"block_structure\": null, \"dynamic\": ",
        binding.role == TensorRole::kWeight ? "false" : "\"local\"",
        ", \"observer\": \"minmax\", \"scale_dtype\": \"torch.float8_e4m3fn\"}");
  }
  QPARAMS_ASSIGN_OR_RETURN(const CompressedTensorsLayout layout,
                           CompressedTensorsLayoutOf(session, binding));
  const QuantDType dtype = DTypeOf(session);
  std::string out = absl::StrCat(
      "{\"num_bits\": ", dtype.bits, ", \"type\": \"", dtype.is_floating_point() ? "float" : "int",
      "\", \"symmetric\": ", session.spec.qscheme == QScheme::kAsymmetric ? "false" : "true",
      ", \"strategy\": \"", layout.strategy, "\", \"group_size\": ");
  if (layout.group_size.has_value()) {
    AppendInt(&out, *layout.group_size);
  } else {
    out.append("null");
  }
  out.append(", \"block_structure\": ");
  if (layout.block_structure.has_value()) {
    AppendList(&out, *layout.block_structure, AppendInt);
  } else {
    out.append("null");
  }
  out.append(", \"dynamic\": false, \"observer\": \"minmax\"}");
  return out;
}

}  // namespace qparams
