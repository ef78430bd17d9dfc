// The bad requests of NVFP4 (nvfp4.md §2, docs/exports.md): specs on CreateSession
// and Compute, and exports to each checkpoint form.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/server/bad_request_table.h"

namespace qparams::testing::bad_request {

std::vector<Row> Nvfp4Rows() {
  Table table;

  // ---- NVFP4 specs on CreateSession and Compute (nvfp4.md §2), last so that the rows
  // before keep their numbers: float8_e4m3fn scales need float4_e2m1fn_x2 and
  // per_block; a convention needs them and is spelled exactly; the FP rules stay ----
  {
    const v1::Granularity block16 = PerBlockAxis(-1, {16});
    auto nvfp4 = [&](const std::string& dtype, const v1::Granularity& g,
                     const std::string& convention = "", v1::QScheme qscheme = v1::SYMMETRIC) {
      v1::QuantSpec spec = WithScaleDType(Spec(dtype, qscheme, g), "float8_e4m3fn");
      spec.set_convention(convention);
      return spec;
    };
    auto with_convention = [](v1::QuantSpec spec, const std::string& convention) {
      spec.set_convention(convention);
      return spec;
    };
    table.Create("e4m3 scales with int8", nvfp4("int8", block16), kInvalid, "spec.scale_dtype");
    table.Create("e4m3 scales with float8_e4m3fn", nvfp4("float8_e4m3fn", block16), kInvalid,
                 "spec.scale_dtype");
    table.Create("e4m3 scales per_tensor", nvfp4("float4_e2m1fn_x2", PerTensor()), kInvalid,
                 "spec.granularity");
    table.Create("e4m3 scales per_channel", nvfp4("float4_e2m1fn_x2", PerChannel(0)), kInvalid,
                 "spec.granularity");
    table.Create("convention without a scale_dtype (e8m0)",
                 with_convention(Spec("float4_e2m1fn_x2", v1::SYMMETRIC, block16), "modelopt"),
                 kInvalid, "spec.convention");
    table.Create("convention with e8m0 scales",
                 with_convention(WithScaleDType(Spec("float4_e2m1fn_x2", v1::SYMMETRIC, block16),
                                                "float8_e8m0fnu"),
                                 "compressed_tensors"),
                 kInvalid, "spec.convention");
    table.Create("convention with int8", with_convention(Spec(), "compressed_tensors"), kInvalid,
                 "spec.convention");
    for (const char* convention : {"torchao", "COMPRESSED_TENSORS", "ModelOpt", " modelopt"}) {
      table.Create(absl::StrCat("convention \"", convention, "\""),
                   nvfp4("float4_e2m1fn_x2", block16, convention), kInvalid, "spec.convention");
    }
    table.Create("e4m3 scales with SYMMETRIC_WITH_CLIPPING",
                 nvfp4("float4_e2m1fn_x2", block16, "", v1::SYMMETRIC_WITH_CLIPPING), kInvalid,
                 "spec.qscheme");
    table.Create("e4m3 scales with ASYMMETRIC",
                 nvfp4("float4_e2m1fn_x2", block16, "modelopt", v1::ASYMMETRIC), kInvalid,
                 "spec.qscheme");
    const v1::Tensor row = F32({1, 16}, std::vector<double>(16, 0.5));
    table.Compute("Compute: e4m3 scales per_tensor", row, kInvalid, "spec.granularity",
                  nvfp4("float4_e2m1fn_x2", PerTensor()), "dynamic");
    table.Compute("Compute: e4m3 scales with int4", row, kInvalid, "spec.scale_dtype",
                  nvfp4("int4", block16), "dynamic");
    table.Compute("Compute: convention \"torchao\"", row, kInvalid, "spec.convention",
                  nvfp4("float4_e2m1fn_x2", block16, "torchao"), "static");
    table.Compute("Compute: convention without e4m3 scales", row, kInvalid, "spec.convention",
                  with_convention(Spec("float4_e2m1fn_x2", v1::SYMMETRIC, block16), "modelopt"),
                  "dynamic");
    table.Compute("Compute: dynamic e4m3 scales with a float_range", row, kInvalid, "float_range",
                  WithFloatRange(nvfp4("float4_e2m1fn_x2", block16), -1.0, 1.0), "dynamic");
  }

  // ---- NVFP4 exports (docs/exports.md): each checkpoint form takes its own
  // convention only, and modelopt NVFP4 sessions only ----
  table.ExportSessions("of a modelopt NVFP4 session to compressed-tensors", kNvfp4Mo,
                       "compressed-tensors", false, kInvalid, "--format=modelopt");
  table.ExportSessions("of a compressed_tensors NVFP4 session to modelopt", kNvfp4Ct, "modelopt",
                       false, kInvalid, "--format=compressed-tensors");
  table.ExportSessions("of an int4 session to modelopt", kExport, "modelopt", false, kInvalid,
                       kExport);
  table.ExportSessions("of an NVFP4 session to onnx", kNvfp4Ct, "onnx", false, kInvalid, kNvfp4Ct);
  table.ExportSessions("of NVFP4 and int sessions together to compressed-tensors", "hard/gmm",
                       "compressed-tensors", false, kInvalid, "separate prefixes");
  table.ExportSessions("of fused siblings with different global scales and no group",
                       kNvfp4CtSiblings, "compressed-tensors", false, kPrecondition, "GLOBAL_AMAX");
  return table.TakeRows();
}

}  // namespace qparams::testing::bad_request
