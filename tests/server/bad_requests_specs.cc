// The bad requests of a tensor and a spec: Compute's tensors, values, granularities
// and calculators, and CreateSession's specs, calculators and names.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/server/bad_request_table.h"

namespace qparams::testing::bad_request {

std::vector<Row> TensorRows() {
  Table table;

  // ---- Malformed tensors: INVALID_ARGUMENT on every path ----
  table.Compute("tensor dtype unset", RawTensor(v1::DTYPE_UNSPECIFIED, {2}, std::string(8, '\0')),
                kInvalid, "tensor.dtype");
  table.Compute("tensor dtype unknown enum 9", RawTensor(9, {2}, std::string(8, '\0')), kInvalid,
                "tensor.dtype");
  table.Compute("tensor dtype negative enum -1", RawTensor(-1, {2}, std::string(8, '\0')), kInvalid,
                "tensor.dtype");
  table.Compute("rank 0 (no shape)", RawTensor(v1::FLOAT32, {}, std::string(4, '\0')), kInvalid,
                "tensor.shape");
  table.Compute("negative dim", RawTensor(v1::FLOAT32, {2, -3}, std::string(24, '\0')), kInvalid,
                "tensor.shape");
  table.Compute("dims whose product overflows int64 (2^32 * 2^32)",
                RawTensor(v1::FLOAT32, {int64_t{1} << 32, int64_t{1} << 32}, ""), kInvalid,
                "tensor.shape");
  table.Compute("dims whose product overflows int64 (INT64_MAX * 2)",
                RawTensor(v1::FLOAT16, {std::numeric_limits<int64_t>::max(), 2}, ""), kInvalid,
                "tensor.shape");
  table.Compute("f32 data one byte short", RawTensor(v1::FLOAT32, {2, 3}, std::string(23, '\0')),
                kInvalid, "tensor.data");
  table.Compute("f32 data one byte long", RawTensor(v1::FLOAT32, {2, 3}, std::string(25, '\0')),
                kInvalid, "tensor.data");
  table.Compute("f16 shape with f32-sized data (too long)",
                RawTensor(v1::FLOAT16, {2, 3}, std::string(24, '\0')), kInvalid, "tensor.data");
  table.Compute("f64 data empty", RawTensor(v1::FLOAT64, {3}, ""), kInvalid, "tensor.data");
  // A huge shape with the wrong data: the length is the error to fix, not the limit.
  table.Compute("huge valid shape 2^40 elements (no data sent)",
                RawTensor(v1::FLOAT32, {int64_t{1} << 20, int64_t{1} << 20}, ""), kInvalid,
                "tensor.data");
  table.Compute("shape of 2^62 float64 elements: the bytes it needs overflow int64",
                RawTensor(v1::FLOAT64, {int64_t{1} << 31, int64_t{1} << 31}, std::string(8, '\0')),
                kInvalid, "needs more than 2^63");
  table.Compute(
      "well-formed tensor one element above max_tensor_elements",
      RawTensor(v1::FLOAT16, {kMaxElements + 1}, std::string(2 * (kMaxElements + 1), '\0')),
      kExhausted, "tensor.shape");
  table.Compute("zero-size tensor [2, 0] on a computing forward",
                RawTensor(v1::FLOAT32, {2, 0}, ""), kInvalid, "tensor.shape");
  table.Compute("zero-size tensor [0] on a computing forward", RawTensor(v1::BFLOAT16, {0}, ""),
                kInvalid, "tensor.shape");
  // Values (Policy 1).
  table.Compute("NaN in float32", F32({4}, {1, kNaN, 3, 4}), kInvalid, "tensor.data");
  table.Compute("+Inf in float16", F16({2, 2}, {1, 2, 3, kInf}), kInvalid, "tensor.data");
  table.Compute("-Inf in bfloat16", Bf16({3}, {-kInf, 0, 1}), kInvalid, "tensor.data");
  table.Compute("NaN in float16", F16({2}, {kNaN, 1}), kInvalid, "tensor.data");
  table.Compute("-Inf in float64", T(v1::FLOAT64, {2}, {1, -kInf}), kInvalid, "tensor.data");
  table.Compute("NaN with both float_range bounds set (still checked)", F32({2}, {kNaN, 1}),
                kInvalid, "tensor.data", WithFloatRange(Spec(), -1.0, 1.0));
  // Granularity against the tensor's rank and shape.
  table.Compute("per_channel axis 2 on rank 2", Good(), kInvalid, "granularity.per_channel.axis",
                Spec("int8", v1::SYMMETRIC, PerChannel(2)));
  table.Compute("per_channel axis -3 on rank 2", Good(), kInvalid, "granularity.per_channel.axis",
                Spec("int8", v1::SYMMETRIC, PerChannel(-3)));
  table.Compute("per_channel axis INT32_MIN", Good(), kInvalid, "granularity.per_channel.axis",
                Spec("int8", v1::SYMMETRIC, PerChannel(std::numeric_limits<int32_t>::min())),
                "dynamic");
  table.Compute("per_block axis 2 on rank 2", Good(), kInvalid, "granularity.per_block.axis",
                Spec("int8", v1::SYMMETRIC, PerBlockAxis(2, {1})));
  table.Compute("per_block block_size 2 does not divide dim 1 (3)", Good(), kInvalid,
                "granularity.per_block.block_size",
                Spec("int8", v1::SYMMETRIC, PerBlockAxis(1, {2})));
  table.Compute("multi-axis block_size of length 1 on rank 2", Good(), kInvalid,
                "granularity.per_block.block_size",
                Spec("int8", v1::SYMMETRIC, PerBlockMulti({2})));
  table.Compute("multi-axis block_size of length 3 on rank 2", Good(), kInvalid,
                "granularity.per_block.block_size",
                Spec("int8", v1::SYMMETRIC, PerBlockMulti({1, 1, 1})), "dynamic");
  table.Compute("multi-axis block_size (-1, 2) does not divide dim 1 (3)", Good(), kInvalid,
                "granularity.per_block.block_size",
                Spec("int8", v1::SYMMETRIC, PerBlockMulti({-1, 2})));
  // Calculators.
  table.Compute("unknown calculator", Good(), kInvalid, "minmax_observer", Spec(),
                "minmax_observer");
  table.Compute("stateful moving_average on Compute", Good(), kInvalid, "CreateSession", Spec(),
                "moving_average");
  table.Compute("stateful global_minmax on Compute", Good(), kInvalid, "CreateSession", Spec(),
                "global_minmax");
  table.Compute("default (stateful) on Compute", Good(), kInvalid, "CreateSession", Spec(),
                "default");
  {
    v1::ComputeRequest both = ComputeReq("static", Spec(), Good());
    both.mutable_range()->add_input_shape(2);
    table.Add("Compute with both a tensor and a range", Method::kCompute, std::move(both), kInvalid,
              "tensor and range are both set");
    v1::ComputeRequest neither = ComputeReq("static", Spec(), Good());
    neither.clear_tensor();
    table.Add("Compute with neither a tensor nor a range", Method::kCompute, std::move(neither),
              kInvalid, "tensor and range are both unset");
  }
  table.Compute("dynamic with a float_range", Good(), kInvalid, "float_range",
                WithFloatRange(Spec(), -1.0, std::nullopt), "dynamic");
  table.Compute("dynamic (\"\") with SYMMETRIC_WITH_CLIPPING", Good(), kInvalid, "spec.qscheme",
                Spec("int8", v1::SYMMETRIC_WITH_CLIPPING), "");
  table.Compute("Compute with a bad spec dtype", Good(), kInvalid, "spec.dtype", Spec("int16"));
  return table.TakeRows();
}

std::vector<Row> SpecRows() {
  Table table;
  const std::string long_name(129, 'a');

  // ---- Bad specs on CreateSession (and a few on Compute) ----
  table.Create("dtype int9", Spec("int9"), kInvalid, "spec.dtype");
  table.Create("dtype int0", Spec("int0"), kInvalid, "spec.dtype");
  table.Create("dtype uppercase INT8", Spec("INT8"), kInvalid, "spec.dtype");
  table.Create("dtype float8_e4m3fnuz", Spec("float8_e4m3fnuz"), kInvalid, "spec.dtype");
  table.Create("dtype float32 (an input dtype)", Spec("float32"), kInvalid, "spec.dtype");
  table.Create("float8_e4m3fn with ASYMMETRIC", Spec("float8_e4m3fn", v1::ASYMMETRIC), kInvalid,
               "spec.qscheme");
  table.Create("float8_e5m2 with SYMMETRIC_WITH_CLIPPING",
               Spec("float8_e5m2", v1::SYMMETRIC_WITH_CLIPPING), kInvalid, "spec.qscheme");
  table.Create("e8m0 scale with uint8", WithScaleDType(Spec("uint8"), "float8_e8m0fnu"), kInvalid,
               "spec.scale_dtype");
  table.Create("e8m0 scale with int4", WithScaleDType(Spec("int4"), "float8_e8m0"), kInvalid,
               "spec.scale_dtype");
  table.Create("e8m0 scale with int8 ASYMMETRIC",
               WithScaleDType(Spec("int8", v1::ASYMMETRIC), "float8_e8m0fnu"), kInvalid,
               "spec.qscheme");
  table.Create("unknown scale_dtype", WithScaleDType(Spec(), "float16"), kInvalid,
               "spec.scale_dtype");
  table.Create("int1 with SYMMETRIC_WITH_CLIPPING (empty range)",
               Spec("int1", v1::SYMMETRIC_WITH_CLIPPING), kInvalid, "spec.qscheme");
  table.Create("float_range.min > 0", WithFloatRange(Spec(), 0.5, std::nullopt), kInvalid,
               "spec.float_range.min");
  table.Create("float_range.max < 0", WithFloatRange(Spec(), std::nullopt, -0.5), kInvalid,
               "spec.float_range.max");
  table.Create("float_range min == max == 0", WithFloatRange(Spec(), 0.0, 0.0), kInvalid,
               "spec.float_range");
  table.Create("float_range.min -Inf", WithFloatRange(Spec(), -kInf, 1.0), kInvalid,
               "spec.float_range.min");
  table.Create("float_range.max NaN", WithFloatRange(Spec(), std::nullopt, kNaN), kInvalid,
               "spec.float_range.max");
  table.Create("quant_min without quant_max", WithQuantRange(Spec(), -10, std::nullopt), kInvalid,
               "quant_max");
  table.Create("quant_max without quant_min", WithQuantRange(Spec(), std::nullopt, 10), kInvalid,
               "quant_min");
  table.Create("quant_min == quant_max", WithQuantRange(Spec(), 5, 5), kInvalid, "quant_min");
  table.Create("quant_min > quant_max", WithQuantRange(Spec(), 10, -10), kInvalid, "quant_min");
  table.Create("non-integral quant_min", WithQuantRange(Spec(), -1.5, 10), kInvalid,
               "spec.quant_min");
  table.Create("non-integral quant_max", WithQuantRange(Spec(), -10, 10.25), kInvalid,
               "spec.quant_max");
  table.Create("NaN quant_min", WithQuantRange(Spec(), kNaN, 10), kInvalid, "spec.quant_min");
  table.Create("int8 quant range [-200, 100] outside the dtype", WithQuantRange(Spec(), -200, 100),
               kInvalid, "quant_min");
  table.Create("uint8 quant_max 256 outside the dtype", WithQuantRange(Spec("uint8"), 0, 256),
               kInvalid, "quant_max");
  table.Create("float8 with a non-derived quant range",
               WithQuantRange(Spec("float8_e4m3fn"), -100, 100), kInvalid, "quant_min");
  table.Create("unknown qscheme enum 7", Spec("int8", static_cast<v1::QScheme>(7)), kInvalid,
               "spec.qscheme");
  table.Create("unknown target enum 5",
               Spec("int8", v1::SYMMETRIC, PerTensor(), static_cast<v1::Target>(5)), kInvalid,
               "spec.target");
  {
    v1::QuantSpec spec = Spec();
    spec.set_range_calculator("percentile");
    table.Create("unknown range_calculator", spec, kInvalid, "spec.range_calculator");
  }
  table.Create("per_block block_size 0", Spec("int8", v1::SYMMETRIC, PerBlockAxis(0, {0})),
               kInvalid, "granularity.per_block.block_size");
  table.Create("per_block block_size -2 (multi-axis)",
               Spec("int8", v1::SYMMETRIC, PerBlockMulti({4, -2})), kInvalid,
               "granularity.per_block.block_size");
  table.Create("per_block with axis and two block sizes",
               Spec("int8", v1::SYMMETRIC, PerBlockAxis(1, {2, 2})), kInvalid,
               "granularity.per_block");
  table.Create("per_block with axis and block size -1",
               Spec("int8", v1::SYMMETRIC, PerBlockAxis(1, {-1})), kInvalid,
               "granularity.per_block");
  // Calculators and averaging_constant.
  table.Create("dynamic on CreateSession", Spec(), kInvalid, "Compute", "dynamic");
  table.Create("unknown calculator", Spec(), kInvalid, "calculator", "minmax_observer");
  table.Create("calculator key is case-sensitive (Static)", Spec(), kInvalid, "calculator",
               "Static");
  table.Create("averaging_constant on static", Spec(), kInvalid, "averaging_constant", "static",
               0.5);
  table.Create("averaging_constant on global_minmax", Spec(), kInvalid, "averaging_constant",
               "global_minmax", 0.01);
  table.Create("averaging_constant on default (WEIGHT resolves to static)", Spec(), kInvalid,
               "averaging_constant", "", 0.01);
  table.Create("averaging_constant 0", Spec(), kInvalid, "averaging_constant", "moving_average",
               0.0);
  table.Create("averaging_constant -0.0", Spec(), kInvalid, "averaging_constant", "moving_average",
               -0.0);
  table.Create("averaging_constant > 1", Spec(), kInvalid, "averaging_constant", "moving_average",
               1.0000001);
  table.Create("averaging_constant NaN", Spec(), kInvalid, "averaging_constant", "moving_average",
               kNaN);
  table.Create("averaging_constant +Inf", Spec(), kInvalid, "averaging_constant", "moving_average",
               kInf);
  // Names and existence.
  table.Create("name empty", Spec(), kInvalid, "name", "static", std::nullopt, "");
  table.Create("name 129 characters", Spec(), kInvalid, "name", "static", std::nullopt, long_name);
  table.Create("name with a space", Spec(), kInvalid, "name", "static", std::nullopt, "hard/a b");
  table.Create("name with a colon", Spec(), kInvalid, "name", "static", std::nullopt, "hard:x");
  table.Create("name with unicode", Spec(), kInvalid, "name", "static", std::nullopt,
               "hard/\xc3\xbc");
  table.Create("name with a NUL byte", Spec(), kInvalid, "name", "static", std::nullopt,
               std::string("hard\0x", 6));
  table.Create("name taken (same calculator)", Spec(), kExists, kStatic, "static", std::nullopt,
               kStatic);
  table.Create("name taken (another calculator)", Spec(), kExists, kMovingAvg, "global_minmax",
               std::nullopt, kMovingAvg);
  return table.TakeRows();
}

}  // namespace qparams::testing::bad_request
