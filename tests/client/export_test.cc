// The export formats (export/export_format.h) on hand-built sessions, and
// ExportSessions end to end: the refusals, tenants, and documents larger than one
// message. The Python tests (tests/python/test_export.py) drive independent
// consumers (torch, onnx.checker, AIMET's published convention) with the output.

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/observation.h"
#include "core/status_macros.h"
#include "domain/engine.h"
#include "export/engine_export_source.h"
#include "export/export_format.h"
#include "export/exporter.h"
#include "export/fused_siblings.h"
#include "export/item_export_source.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/status.h"
#include "qparams/client.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

// An initialized session of `spec` (resolved here) with qparams of shape `shape`:
// scales 0.5, 0.25, ... and zero points 1, 2, ... (when the dtype has them).
SessionInfo Initialized(const std::string& name, QuantSpec spec, Shape shape) {
  SessionInfo session;
  session.name = name;
  session.spec = *spec.Resolve();
  session.initialized = true;
  session.qparams.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  session.qparams.has_zero_point =
      !ParseQuantDType(session.spec.dtype)->is_floating_point() && !session.spec.e8m0_scale();
  for (int64_t i = 0; i < n; ++i) {
    session.qparams.scale.push_back(0.5f / static_cast<float>(i + 1));
    if (session.qparams.has_zero_point) {
      session.qparams.zero_point.push_back(static_cast<int32_t>(i + 1));
    }
  }
  return session;
}

QuantSpec Spec(const std::string& dtype, Granularity granularity = Granularity::PerTensor(),
               QScheme qscheme = QScheme::kSymmetric, Target target = Target::kWeight) {
  QuantSpec spec;
  spec.dtype = dtype;
  spec.granularity = granularity;
  spec.qscheme = qscheme;
  spec.target = target;
  return spec;
}

absl::StatusOr<std::string> Render(ExportFormat format, const SessionInfo& session,
                                   const std::string& prefix = "run") {
  return RenderSession(format, session, BindTensor(session.name, prefix, session.spec.target), "");
}

TEST(ExportFormat, ParsesTheFourNamesOnly) {
  EXPECT_EQ(*ParseExportFormat("aimet"), ExportFormat::kAimet);
  EXPECT_EQ(*ParseExportFormat("onnx"), ExportFormat::kOnnx);
  EXPECT_EQ(*ParseExportFormat("compressed-tensors"), ExportFormat::kCompressedTensors);
  EXPECT_EQ(*ParseExportFormat("modelopt"), ExportFormat::kModelOpt);
  for (const char* bad : {"", "AIMET", "json", "compressed_tensors", "ModelOpt", "model-opt"}) {
    const absl::StatusOr<ExportFormat> format = ParseExportFormat(bad);
    EXPECT_CODE(format, kInvalid);
    EXPECT_TRUE(absl::StrContains(format.status().message(), "format")) << format.status();
  }
}

TEST(ExportFormat, NamesStripThePrefixAndChooseTheRole) {
  struct Case {
    std::string session, prefix;
    Target target;
    std::string tensor;
    TensorRole role;
    std::string module;
  };
  for (const Case& c : std::vector<Case>{
           {"run/fc1.weight", "run", Target::kWeight, "fc1.weight", TensorRole::kWeight, "fc1"},
           {"run/fc1.weight", "run/", Target::kWeight, "fc1.weight", TensorRole::kWeight, "fc1"},
           {"run.fc1", "run", Target::kWeight, "fc1", TensorRole::kWeight, "fc1"},
           {"run/fc1.input", "run", Target::kActivation, "fc1.input", TensorRole::kInput, "fc1"},
           {"run/fc1", "run", Target::kActivation, "fc1", TensorRole::kInput, "fc1"},
           {"run/fc1.output", "run", Target::kActivation, "fc1.output", TensorRole::kOutput, "fc1"},
           {"run/fc1.activation_post_process", "run", Target::kActivation,
            "fc1.activation_post_process", TensorRole::kOutput, "fc1"},
           // The target decides for weights, whatever the suffix.
           {"run/fc1.output", "run", Target::kWeight, "fc1.output", TensorRole::kWeight, "fc1"},
           {"run", "run", Target::kWeight, "run", TensorRole::kWeight, "run"},
           {"a/b", "", Target::kWeight, "a/b", TensorRole::kWeight, "a/b"},
           {"x.weight", "x.", Target::kWeight, "weight", TensorRole::kWeight, "weight"},
           // A hash tag places the session; the checkpoint names the module.
           {"run/{model.l0.attn}.q_proj.weight", "run", Target::kWeight,
            "model.l0.attn.q_proj.weight", TensorRole::kWeight, "model.l0.attn.q_proj"},
           {"run/{model.l0.attn}.q_proj.input", "run", Target::kActivation,
            "model.l0.attn.q_proj.input", TensorRole::kInput, "model.l0.attn.q_proj"},
       }) {
    const TensorBinding binding = BindTensor(c.session, c.prefix, c.target);
    EXPECT_EQ(binding.tensor, c.tensor) << c.session << " under " << c.prefix;
    EXPECT_EQ(binding.role, c.role) << c.session;
    EXPECT_EQ(binding.module, c.module) << c.session;
  }
}

// AIMET's offset is quant_min - zero_point: the grid it quantizes onto is unsigned.
TEST(ExportFormat, AimetOffsetsAreQuantMinMinusTheZeroPoint) {
  const SessionInfo asym = Initialized(
      "run/act", Spec("uint8", Granularity::PerTensor(), QScheme::kAsymmetric, Target::kActivation),
      {1});
  EXPECT_EQ(*Render(ExportFormat::kAimet, asym),
            "{\"name\": \"act\", \"dtype\": \"INT\", \"enc_type\": \"PER_TENSOR\", \"bw\": 8, "
            "\"is_sym\": false, \"scale\": [0.5], \"offset\": [-1]}");
  SessionInfo sym = Initialized("run/w", Spec("int8", Granularity::PerChannel(0)), {3, 1});
  sym.qparams.zero_point = {0, 0, 0};
  EXPECT_EQ(*Render(ExportFormat::kAimet, sym),
            "{\"name\": \"w\", \"dtype\": \"INT\", \"enc_type\": \"PER_CHANNEL\", \"bw\": 8, "
            "\"is_sym\": true, \"scale\": [0.5, 0.25, 0.16666667], \"offset\": [-128, -128, "
            "-128]}");
  const SessionInfo blocks =
      Initialized("run/w4", Spec("int4", Granularity::PerBlock(1, 16)), {2, 2});
  EXPECT_EQ(*Render(ExportFormat::kAimet, blocks),
            "{\"name\": \"w4\", \"dtype\": \"INT\", \"enc_type\": \"PER_BLOCK\", \"bw\": 4, "
            "\"is_sym\": true, \"scale\": [0.5, 0.25, 0.16666667, 0.125], \"offset\": [-9, -10, "
            "-11, -12], \"block_size\": 16}");
}

TEST(ExportFormat, AimetRefusesWhatVersion1CannotExpress) {
  QuantSpec e8m0 = Spec("int8");
  e8m0.scale_dtype = "float8_e8m0fnu";
  QuantSpec clipped = Spec("int8", Granularity::PerTensor(), QScheme::kSymmetricWithClipping);
  for (const auto& [session, reason] : std::vector<std::pair<SessionInfo, std::string>>{
           {Initialized("run/fp8", Spec("float8_e4m3fn"), {1}), "floating point"},
           {Initialized("run/e8m0", e8m0, {1}), "e8m0"},
           {Initialized("run/clip", clipped, {1}), "[-127, 127]"},
           {Initialized("run/axis1", Spec("int8", Granularity::PerChannel(1)), {1, 4}), "axis 1"},
           {Initialized("run/conv", Spec("int8", Granularity::PerBlock(1, 4)), {8, 2, 1, 1}),
            "blocks more than one axis"},
           {Initialized("run/rows", Spec("int8", Granularity::PerBlock(0, 4)), {2, 8}),
            "PER_BLOCK"},
       }) {
    const absl::StatusOr<std::string> rendered = Render(ExportFormat::kAimet, session);
    EXPECT_CODE(rendered, kInvalid);
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), session.name)) << rendered.status();
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), reason)) << rendered.status();
  }
}

TEST(ExportFormat, OnnxGivesQuantizeLinearInputsInTheirShapes) {
  EXPECT_EQ(*Render(ExportFormat::kOnnx, Initialized("run/t", Spec("uint8"), {1})),
            "{\"name\": \"t\", \"output_dtype\": \"uint8\", \"y_scale\": 0.5, "
            "\"y_zero_point\": 1}");
  EXPECT_EQ(*Render(ExportFormat::kOnnx,
                    Initialized("run/c", Spec("int8", Granularity::PerChannel(-1)), {1, 2})),
            "{\"name\": \"c\", \"output_dtype\": \"int8\", \"y_scale\": [0.5, 0.25], "
            "\"y_zero_point\": [1, 2], \"axis\": 1}");
  EXPECT_EQ(*Render(ExportFormat::kOnnx,
                    Initialized("run/b", Spec("int4", Granularity::PerBlock({1, 8})), {2, 2})),
            "{\"name\": \"b\", \"output_dtype\": \"int4\", \"y_scale\": [[0.5, 0.25], "
            "[0.16666667, 0.125]], \"y_zero_point\": [[1, 2], [3, 4]], \"axis\": 1, "
            "\"block_size\": 8}");
  // No zero point for floating-point dtypes; e8m0 scales are plain floats to ONNX.
  QuantSpec mx = Spec("float4_e2m1fn_x2", Granularity::PerBlock(1, 32));
  EXPECT_EQ(*Render(ExportFormat::kOnnx, Initialized("run/mx", mx, {1, 1})),
            "{\"name\": \"mx\", \"output_dtype\": \"float4e2m1\", \"y_scale\": [[0.5]], "
            "\"axis\": 1, \"block_size\": 32}");
  for (const auto& [session, reason] : std::vector<std::pair<SessionInfo, std::string>>{
           {Initialized("run/i3", Spec("int3"), {1}), "no ONNX type"},
           {Initialized("run/clip",
                        Spec("int8", Granularity::PerTensor(), QScheme::kSymmetricWithClipping),
                        {1}),
            "whole range"},
           {Initialized("run/2d", Spec("int8", Granularity::PerBlock({2, 8})), {2, 2}), "one axis"},
       }) {
    const absl::StatusOr<std::string> rendered = Render(ExportFormat::kOnnx, session);
    EXPECT_CODE(rendered, kInvalid);
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), session.name)) << rendered.status();
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), reason)) << rendered.status();
  }
}

TEST(ExportFormat, CompressedTensorsNamesShapesAndArgs) {
  const SessionInfo channel =
      Initialized("run/fc1.weight", Spec("int8", Granularity::PerChannel(0)), {2, 1});
  EXPECT_EQ(*Render(ExportFormat::kCompressedTensors, channel),
            "\"fc1.weight_scale\": {\"dtype\": \"float32\", \"shape\": [2, 1], \"data\": [0.5, "
            "0.25]},\n\"fc1.weight_zero_point\": {\"dtype\": \"int8\", \"shape\": [2, 1], "
            "\"data\": [1, 2]}");
  // uint8's zero point moves onto the signed grid.
  const SessionInfo input = Initialized(
      "run/fc1.input",
      Spec("uint8", Granularity::PerTensor(), QScheme::kAsymmetric, Target::kActivation), {1});
  EXPECT_TRUE(absl::StrContains(*Render(ExportFormat::kCompressedTensors, input),
                                "\"fc1.input_zero_point\": {\"dtype\": \"int8\", \"shape\": "
                                "[1], \"data\": [-127]}"));
  const TensorBinding group_binding = BindTensor("run/fc2.weight", "run", Target::kWeight);
  EXPECT_EQ(*CompressedTensorsArgs(
                Initialized("run/fc2.weight", Spec("int4", Granularity::PerBlock(1, 32)), {4, 2}),
                group_binding),
            "{\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\", "
            "\"group_size\": 32, \"block_structure\": null, \"dynamic\": false, \"observer\": "
            "\"minmax\"}");
  EXPECT_TRUE(absl::StrContains(
      *CompressedTensorsArgs(
          Initialized("run/fc2.weight", Spec("int8", Granularity::PerBlock({64, 32})), {4, 2}),
          group_binding),
      "\"strategy\": \"block\", \"group_size\": null, \"block_structure\": [64, 32]"));
  const SessionInfo output = Initialized(
      "run/fc1.activation_post_process",
      Spec("float8_e4m3fn", Granularity::PerTensor(), QScheme::kSymmetric, Target::kActivation),
      {1});
  EXPECT_EQ(*Render(ExportFormat::kCompressedTensors, output),
            "\"fc1.output_scale\": {\"dtype\": \"float32\", \"shape\": [1], \"data\": [0.5]}");
  for (const auto& [session, reason] : std::vector<std::pair<SessionInfo, std::string>>{
           {Initialized("run/e5m2", Spec("float8_e5m2"), {1}), "e4m3"},
           {Initialized(
                "run/a",
                Spec("int8", Granularity::PerChannel(1), QScheme::kSymmetric, Target::kActivation),
                {1, 4}),
            "activations"},
           {Initialized("run/w", Spec("int8", Granularity::PerChannel(1)), {1, 4}), "axis 1"},
       }) {
    const absl::StatusOr<std::string> rendered = Render(ExportFormat::kCompressedTensors, session);
    EXPECT_CODE(rendered, kInvalid);
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), session.name)) << rendered.status();
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), reason)) << rendered.status();
  }
}

// An NVFP4 session (float4_e2m1fn_x2, e4m3 scales) of `convention` with the block
// bytes `bytes` of shape `shape` and global scale `global_scale`.
SessionInfo Nvfp4(const std::string& name, const std::string& convention, Shape shape,
                  std::vector<uint8_t> bytes, float global_scale,
                  Granularity granularity = Granularity::PerBlock(-1, 16),
                  Target target = Target::kWeight) {
  QuantSpec spec = Spec("float4_e2m1fn_x2", granularity, QScheme::kSymmetric, target);
  spec.scale_dtype = "float8_e4m3fn";
  spec.convention = convention;
  SessionInfo session = Initialized(name, spec, shape);
  session.qparams.scale_e4m3 = std::move(bytes);
  session.qparams.global_scale = global_scale;
  return session;
}

SessionInfo Nvfp4Input(const std::string& name, const std::string& convention,
                       float global_scale) {
  return Nvfp4(name, convention, {1, 2}, {0x7E, 0x70}, global_scale,
               Granularity::PerBlock({-1, 16}), Target::kActivation);
}

// nvfp4.md section 6, compressed-tensors: e4m3 bytes [out, in/16], a [1] global
// scale, the NVFP4 preset's args (E1's gs 0x43C00001 prints as 384.00003).
TEST(ExportFormat, Nvfp4CompressedTensorsTensorsAndArgs) {
  const SessionInfo weight = Nvfp4("run/l0.q_proj.weight", "compressed_tensors", {2, 2},
                                   {0x7E, 0x76, 0x68, 0x20}, FloatFromBits(0x43C00001));
  EXPECT_EQ(*Render(ExportFormat::kCompressedTensors, weight),
            "\"l0.q_proj.weight_scale\": {\"dtype\": \"float8_e4m3fn\", \"shape\": [2, 2], "
            "\"data\": [126, 118, 104, 32]},\n\"l0.q_proj.weight_global_scale\": {\"dtype\": "
            "\"float32\", \"shape\": [1], \"data\": [384.00003]}");
  const SessionInfo input = Nvfp4Input("run/l0.q_proj.input", "compressed_tensors", 896);
  EXPECT_EQ(*Render(ExportFormat::kCompressedTensors, input),
            "\"l0.q_proj.input_global_scale\": {\"dtype\": \"float32\", \"shape\": [1], "
            "\"data\": [896]}");
  const std::string args =
      "{\"num_bits\": 4, \"type\": \"float\", \"symmetric\": true, \"strategy\": "
      "\"tensor_group\", \"group_size\": 16, \"block_structure\": null, \"dynamic\": %s, "
      "\"observer\": \"minmax\", \"scale_dtype\": \"torch.float8_e4m3fn\"}";
  EXPECT_EQ(*CompressedTensorsArgs(weight, BindTensor(weight.name, "run", Target::kWeight)),
            absl::StrReplaceAll(args, {{"%s", "false"}}));
  EXPECT_EQ(*CompressedTensorsArgs(input, BindTensor(input.name, "run", Target::kActivation)),
            absl::StrReplaceAll(args, {{"%s", "\"local\""}}));
}

// ModelOpt: the same bytes, scale_2 and input_scale as scalars (shape []).
TEST(ExportFormat, Nvfp4ModelOptTensors) {
  const SessionInfo weight = Nvfp4("run/l0.q_proj.weight", "modelopt", {2, 2},
                                   {0x7E, 0x76, 0x68, 0x38}, FloatFromBits(0x3B2AAAAB));
  EXPECT_EQ(*Render(ExportFormat::kModelOpt, weight),
            "\"l0.q_proj.weight_scale\": {\"dtype\": \"float8_e4m3fn\", \"shape\": [2, 2], "
            "\"data\": [126, 118, 104, 56]},\n\"l0.q_proj.weight_scale_2\": {\"dtype\": "
            "\"float32\", \"shape\": [], \"data\": [0.0026041667]}");
  EXPECT_EQ(*Render(ExportFormat::kModelOpt,
                    Nvfp4Input("run/l0.q_proj.input", "modelopt", FloatFromBits(0x3A924925))),
            "\"l0.q_proj.input_scale\": {\"dtype\": \"float32\", \"shape\": [], "
            "\"data\": [0.0011160715]}");
}

TEST(ExportFormat, Nvfp4FormatsRefuseWhatTheirCheckpointsCannotHold) {
  const std::vector<uint8_t> four = {0x7E, 0x76, 0x68, 0x38};
  struct Case {
    ExportFormat format;
    SessionInfo session;
    std::string reason;
  };
  for (const Case& c : std::vector<Case>{
           {ExportFormat::kCompressedTensors, Nvfp4("run/mo.weight", "modelopt", {2, 2}, four, 1),
            "convention is modelopt"},
           {ExportFormat::kCompressedTensors, Nvfp4("run/mo.weight", "modelopt", {2, 2}, four, 1),
            "--format=modelopt"},
           {ExportFormat::kModelOpt, Nvfp4("run/ct.weight", "compressed_tensors", {2, 2}, four, 1),
            "--format=compressed-tensors"},
           {ExportFormat::kModelOpt, Initialized("run/i8.weight", Spec("int8"), {1}),
            "not NVFP4's"},
           {ExportFormat::kModelOpt,
            Initialized("run/mx.weight", Spec("float4_e2m1fn_x2", Granularity::PerBlock(1, 32)),
                        {1, 1}),
            "scale_dtype float8_e8m0fnu"},
           {ExportFormat::kCompressedTensors,
            Nvfp4("run/b32.weight", "compressed_tensors", {2, 1}, {0x7E, 0x76}, 1,
                  Granularity::PerBlock(-1, 32)),
            "blocks of 16 along the last axis"},
           {ExportFormat::kModelOpt,
            Nvfp4("run/moe.weight", "modelopt", {2, 2, 1}, four, 1),
            "2-D weight [out, in]"},
           {ExportFormat::kModelOpt,
            Nvfp4("run/fc.output", "modelopt", {1, 2}, {0x7E, 0x70}, 1,
                  Granularity::PerBlock({-1, 16}), Target::kActivation),
            "not a module's output"},
           {ExportFormat::kOnnx, Nvfp4("run/ct.weight", "compressed_tensors", {2, 2}, four, 1),
            "two levels"},
       }) {
    const absl::StatusOr<std::string> rendered = Render(c.format, c.session);
    EXPECT_CODE(rendered, kInvalid);
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), c.session.name))
        << rendered.status();
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), c.reason)) << rendered.status();
  }
}

// JSON holds no Inf, and no format a zero point quantizing would never give: a
// float32 range wider than float32's largest value overflows the scale.
TEST(ExportFormat, EveryFormatRefusesInfiniteScalesAndStrayZeroPoints) {
  SessionInfo overflowed =
      Initialized("run/huge", Spec("int8", Granularity::PerChannel(0)), {2, 1});
  overflowed.qparams.scale[1] = std::numeric_limits<float>::infinity();
  SessionInfo stray =
      Initialized("run/stray", Spec("uint8", Granularity::PerTensor(), QScheme::kAsymmetric), {1});
  stray.qparams.zero_point[0] = std::numeric_limits<int32_t>::min();
  for (ExportFormat format :
       {ExportFormat::kAimet, ExportFormat::kOnnx, ExportFormat::kCompressedTensors}) {
    for (const auto& [session, reason] : std::vector<std::pair<SessionInfo, std::string>>{
             {overflowed, "scale 1 is inf"}, {stray, "zero point 0 is -2147483648"}}) {
      const absl::StatusOr<std::string> rendered = Render(format, session);
      EXPECT_CODE(rendered, kInvalid);
      EXPECT_TRUE(absl::StrContains(rendered.status().message(), session.name))
          << rendered.status();
      EXPECT_TRUE(absl::StrContains(rendered.status().message(), reason)) << rendered.status();
    }
  }
}

// ---------------------------------------------------------------- scale groups

// Groups as a test states them: the exporter writes the group's result, which the
// domain computes (nvfp4.md 4.2), so the fake's results are given, not computed.
class FakeGroups : public ExportGroupSource {
 public:
  std::vector<Group> groups;
  std::map<std::string, absl::StatusOr<Result>> results;

  absl::StatusOr<std::vector<Group>> GlobalAmaxGroups(const std::string& tenant) const override {
    EXPECT_EQ(tenant, "t");
    return groups;
  }
  absl::StatusOr<Result> GroupResult(const std::string& tenant,
                                     const std::string& group) const override {
    EXPECT_EQ(tenant, "t");
    return results.at(group);
  }
};

class ExportGroupsTest : public ::testing::Test {
 protected:
  // An NVFP4 session of convention compressed_tensors; a weight [2, 32] of amax
  // `amax` (observed unless 0), or an activation in [-1, 16] blocks.
  void Create(const std::string& name, bool weight, double amax) {
    QuantSpec spec;
    spec.dtype = "float4_e2m1fn_x2";
    spec.scale_dtype = "float8_e4m3fn";
    spec.target = weight ? Target::kWeight : Target::kActivation;
    spec.granularity = weight ? Granularity::PerBlock(-1, 16) : Granularity::PerBlock({-1, 16});
    ASSERT_OK(engine_.CreateSession("t", name, "global_minmax", spec, {}));
    if (amax == 0) return;
    std::vector<double> values(64, 0.25);
    values[5] = -amax;
    const Tensor x = F32({2, 32}, values);
    ASSERT_OK(engine_.Observe("t", name, Observation::FromTensor(x.view())).status);
  }

  // A member's result: its blocks, under the group's global scale.
  static ExportGroupSource::Member Member(const std::string& name, std::vector<uint8_t> bytes,
                                          float global_scale) {
    ExportGroupSource::Member member;
    member.name = name;
    member.qparams.shape = {2, 2};
    for (uint8_t b : bytes) member.qparams.scale.push_back(static_cast<float>(b));
    member.qparams.scale_e4m3 = std::move(bytes);
    member.qparams.global_scale = global_scale;
    return member;
  }
  static ExportGroupSource::Member Filled(const std::string& name, float global_scale) {
    ExportGroupSource::Member member;
    member.name = name;
    member.filled = true;
    member.qparams.global_scale = global_scale;
    return member;
  }

  absl::StatusOr<std::string> Export(const std::string& format, const std::string& prefix = "run/") {
    QPARAMS_ASSIGN_OR_RETURN(
        std::unique_ptr<Exporter> exporter,
        Exporter::Start(&engine_, "t", {prefix, format, false, {}}, &groups_));
    std::string document;
    for (;;) {
      QPARAMS_ASSIGN_OR_RETURN(std::string piece, exporter->Next());
      if (piece.empty()) return document;
      document += piece;
    }
  }

  Engine engine_;
  FakeGroups groups_;
};

// Members of a GLOBAL_AMAX group export the group's global scale and their own
// blocks under it, so that fused siblings agree; a filled input exports the
// group's global scale.
TEST_F(ExportGroupsTest, MembersExportTheGroupsResult) {
  Create("run/l0.q_proj.weight", true, 1);
  Create("run/l0.k_proj.weight", true, 3);
  Create("run/l0.v_proj.weight", true, 7);
  Create("run/l0.q_proj.input", false, 0);  // filled
  Create("run/l1.q_proj.input", false, 0);  // in no group: refused as uninitialized
  const absl::StatusOr<std::string> ungrouped = Export("compressed-tensors");
  EXPECT_CODE(ungrouped, kPrecondition);
  EXPECT_TRUE(absl::StrContains(ungrouped.status().message(), "2 of the 5 sessions"))
      << ungrouped.status();

  const float g = FloatFromBits(0x43C00001);
  groups_.groups = {{"qkv", {"run/l0.q_proj.weight", "run/l0.k_proj.weight", "run/l0.v_proj.weight"}},
                    {"inputs", {"run/l0.q_proj.input", "elsewhere/x.input"}, true}};
  groups_.results["qkv"] = ExportGroupSource::Result{
      true, {}, g,
      {Member("run/l0.q_proj.weight", {0x68, 0x08, 0x20, 0x20}, g),
       Member("run/l0.k_proj.weight", {0x76, 0x08, 0x20, 0x20}, g),
       Member("run/l0.v_proj.weight", {0x7E, 0x08, 0x20, 0x20}, g)}};
  groups_.results["inputs"] = ExportGroupSource::Result{
      true, {"run/l0.q_proj.input"}, 768,
      {Filled("run/l0.q_proj.input", 768), Member("elsewhere/x.input", {1, 2, 3, 4}, 768)}};
  const absl::StatusOr<std::string> uninitialized = Export("compressed-tensors");
  EXPECT_CODE(uninitialized, kPrecondition);
  EXPECT_TRUE(absl::StrContains(uninitialized.status().message(), "1 of the 5 sessions"))
      << uninitialized.status();
  EXPECT_TRUE(absl::StrContains(uninitialized.status().message(), "run/l1.q_proj.input"))
      << uninitialized.status();

  ASSERT_OK(engine_.DeleteSession("t", "run/l1.q_proj.input"));
  ASSERT_OK_AND_ASSIGN(const std::string document, Export("compressed-tensors"));
  EXPECT_TRUE(absl::StrContains(
      document,
      R"("l0.k_proj.weight_scale": {"dtype": "float8_e4m3fn", "shape": [2, 2], "data": [118, 8, 32, 32]},
    "l0.k_proj.weight_global_scale": {"dtype": "float32", "shape": [1], "data": [384.00003]},
    "l0.q_proj.input_global_scale": {"dtype": "float32", "shape": [1], "data": [768]},
    "l0.q_proj.weight_scale": {"dtype": "float8_e4m3fn", "shape": [2, 2], "data": [104, 8, 32, 32]},
    "l0.q_proj.weight_global_scale": {"dtype": "float32", "shape": [1], "data": [384.00003]},
    "l0.v_proj.weight_scale": {"dtype": "float8_e4m3fn", "shape": [2, 2], "data": [126, 8, 32, 32]},
    "l0.v_proj.weight_global_scale": {"dtype": "float32", "shape": [1], "data": [384.00003]})"))
      << document;
  EXPECT_FALSE(absl::StrContains(document, "elsewhere")) << document;
  // Formats other than the NVFP4 ones read no group.
  EXPECT_CODE(Export("onnx"), kInvalid);
}

// The document of `exporter` to its end.
absl::StatusOr<std::string> Document(Exporter& exporter) {
  std::string document;
  for (;;) {
    QPARAMS_ASSIGN_OR_RETURN(std::string piece, exporter.Next());
    if (piece.empty()) return document;
    document += piece;
  }
}

// The store's items under `prefix` (scale groups applied), in reverse name order.
absl::StatusOr<std::vector<ExportItem>> StoreItems(const Engine& engine,
                                                   const ExportGroupSource& groups,
                                                   const std::string& prefix,
                                                   ExportFormat format) {
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<EngineExportSource> source,
                           EngineExportSource::Create(&engine, "t", prefix, format, &groups));
  std::unique_ptr<ExportPass> pass = source->NewPass();
  std::vector<ExportItem> items;
  for (;;) {
    QPARAMS_ASSIGN_OR_RETURN(const ExportItem* item, pass->Next());
    if (item == nullptr) break;
    items.insert(items.begin(), *item);
  }
  return items;
}

// The same sessions supplied as items (a sharded export's, in any order) render the
// store's bytes, refusals included.
TEST_F(ExportGroupsTest, SuppliedItemsRenderTheStoresDocument) {
  Create("run/l0.q_proj.weight", true, 1);
  Create("run/l0.k_proj.weight", true, 3);
  Create("run/l0.v_proj.weight", true, 7);
  Create("run/l0.q_proj.input", false, 0);  // filled by its group
  Create("run/l1.up_proj.weight", true, 2);
  const float g = FloatFromBits(0x43C00001);
  groups_.groups = {{"qkv", {"run/l0.q_proj.weight", "run/l0.k_proj.weight", "run/l0.v_proj.weight"}},
                    {"inputs", {"run/l0.q_proj.input"}, true}};
  groups_.results["qkv"] = ExportGroupSource::Result{
      true, {}, g,
      {Member("run/l0.q_proj.weight", {0x68, 0x08, 0x20, 0x20}, g),
       Member("run/l0.k_proj.weight", {0x76, 0x08, 0x20, 0x20}, g),
       Member("run/l0.v_proj.weight", {0x7E, 0x08, 0x20, 0x20}, g)}};
  groups_.results["inputs"] = ExportGroupSource::Result{true, {}, g, {Filled("run/l0.q_proj.input", g)}};
  for (const auto& [prefix, format] : std::vector<std::pair<std::string, std::string>>{
           {"run/", "compressed-tensors"}, {"run/", "modelopt"}, {"run/l1", "onnx"},
           {"nothing/", "aimet"}}) {
    const absl::StatusOr<std::string> expected = Export(format, prefix);
    ASSERT_OK_AND_ASSIGN(const ExportFormat parsed, ParseExportFormat(format));
    ASSERT_OK_AND_ASSIGN(std::vector<ExportItem> items,
                         StoreItems(engine_, groups_, prefix, parsed));
    auto source = std::make_unique<ItemExportSource>(prefix);
    for (ExportItem& item : items) ASSERT_OK(source->Add(std::move(item)));
    ASSERT_OK(source->Seal());
    absl::StatusOr<std::unique_ptr<Exporter>> exporter =
        Exporter::Start(std::move(source), {prefix, format, false, {}});
    const absl::StatusOr<std::string> got =
        exporter.ok() ? Document(**exporter) : absl::StatusOr<std::string>(exporter.status());
    EXPECT_EQ(got.status(), expected.status()) << prefix << " " << format;
    if (expected.ok() && got.ok()) {
      EXPECT_EQ(*got, *expected) << prefix << " " << format;
    }
  }
  EXPECT_OK(Export("compressed-tensors").status());
}

// Supplied items come from the wire: what rendering relies on is checked first.
TEST_F(ExportGroupsTest, SuppliedItemsAreCheckedAndBounded) {
  Create("run/l0.q_proj.weight", true, 1);
  ASSERT_OK_AND_ASSIGN(std::vector<ExportItem> items,
                       StoreItems(engine_, groups_, "run/", ExportFormat::kCompressedTensors));
  ASSERT_EQ(items.size(), 1u);
  const ExportItem good = items[0];
  std::vector<std::pair<std::string, ExportItem>> bad;
  ExportItem item = good;
  item.session.name = "elsewhere/x";
  bad.emplace_back("not under the prefix", item);
  item = good;
  item.session.name = "run/bad name";
  bad.emplace_back("export item name", item);
  item = good;
  item.session.spec.convention.clear();  // "" resolves to compressed_tensors
  bad.emplace_back("not resolved", item);
  item = good;
  item.session.qparams.scale_e4m3.pop_back();
  bad.emplace_back("scales for qparams.shape", item);
  item = good;
  item.session.qparams.scale.push_back(1);  // NVFP4 keeps the codes only
  bad.emplace_back("not one per scale", item);
  item = good;
  item.session.qparams.shape = {-1, -4};
  bad.emplace_back("qparams.shape", item);
  for (const auto& [needle, malformed] : bad) {
    ItemExportSource source("run/");
    const absl::Status refused = source.Add(malformed);
    EXPECT_CODE(refused, absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_TRUE(absl::StrContains(refused.message(), needle)) << needle << ": " << refused;
  }
  // A per-channel axis the qparams' rank does not have.
  QuantSpec spec;
  spec.granularity = Granularity::PerChannel(3);
  ASSERT_OK(engine_.CreateSession("t", "run/w", "global_minmax", spec, {}));
  ASSERT_OK(engine_.Observe("t", "run/w", Observation::FromTensor(F32({2, 2, 2, 2}, std::vector<double>(16, 1)).view())).status);
  ASSERT_OK_AND_ASSIGN(items, StoreItems(engine_, groups_, "run/w", ExportFormat::kOnnx));
  ASSERT_EQ(items.size(), 1u);
  items[0].session.qparams.shape = {16};
  items[0].session.qparams.scale.resize(16);
  items[0].session.qparams.zero_point.resize(16);
  if (items[0].session.qparams.has_minval) items[0].session.qparams.minval.resize(16);
  const absl::Status unfit = ItemExportSource("run/").Add(items[0]);
  EXPECT_CODE(unfit, absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(unfit.message(), "does not fit qparams of rank 1")) << unfit;

  ItemExportSource twice("run/");
  ASSERT_OK(twice.Add(good));
  ASSERT_OK(twice.Add(good));
  const absl::Status sealed = twice.Seal();
  EXPECT_CODE(sealed, absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(sealed.message(), "given twice")) << sealed;

  ItemExportSource by_count("run/", 1);
  ASSERT_OK(by_count.Add(good));
  EXPECT_CODE(by_count.Add(good), absl::StatusCode::kResourceExhausted);
  ItemExportSource by_bytes("run/", 10, ItemExportSource::HeldBytes(good) + 1);
  ASSERT_OK(by_bytes.Add(good));
  EXPECT_CODE(by_bytes.Add(good), absl::StatusCode::kResourceExhausted);
}

TEST_F(ExportGroupsTest, RefusesGroupsWithoutAResultToExport) {
  Create("run/l0.q_proj.weight", true, 1);
  Create("run/l0.k_proj.weight", true, 0);
  const std::vector<std::string> members = {"run/l0.q_proj.weight", "run/l0.k_proj.weight"};
  struct Case {
    std::string what;
    bool fill;
    absl::StatusOr<ExportGroupSource::Result> result;
    std::vector<std::string> needles;
  };
  const float g = 2688;
  for (const Case& c : std::vector<Case>{
           {"uncalibrated, no fill", false,
            ExportGroupSource::Result{false, {"run/l0.k_proj.weight"}, 0, {}},
            {"scale group qk", "run/l0.q_proj.weight, run/l0.k_proj.weight",
             "uncalibrated members run/l0.k_proj.weight", "fill_uncalibrated"}},
           {"a filled weight", true,
            ExportGroupSource::Result{true,
                                      {"run/l0.k_proj.weight"},
                                      g,
                                      {Member("run/l0.q_proj.weight", {1, 2, 3, 4}, g),
                                       Filled("run/l0.k_proj.weight", g)}},
            {"scale group qk fills session run/l0.k_proj.weight", "no block scales"}},
           {"the group's own error", false,
            absl::FailedPreconditionError("member run/l0.k_proj.weight was deleted"),
            {"scale group qk: member run/l0.k_proj.weight was deleted"}},
       }) {
    groups_.groups = {{"qk", members, c.fill}};
    groups_.results.clear();
    groups_.results.emplace("qk", c.result);
    for (const std::string format : {"compressed-tensors", "modelopt"}) {
      // Before the sessions' own checks: modelopt would refuse their convention.
      const absl::StatusOr<std::string> refused = Export(format);
      EXPECT_CODE(refused, kPrecondition) << c.what << " in " << format;
      for (const std::string& needle : c.needles) {
        EXPECT_TRUE(absl::StrContains(refused.status().message(), needle))
            << c.what << ": " << needle << " in " << refused.status();
      }
    }
  }
  // One session in two groups whose global scales differ.
  ASSERT_OK(engine_.Observe("t", "run/l0.k_proj.weight",
                            Observation::FromTensor(F32({2, 32}, std::vector<double>(64, 1)).view()))
                .status);
  groups_.groups = {{"a", members}, {"b", {"run/l0.q_proj.weight"}}};
  groups_.results.clear();
  groups_.results.emplace("a", ExportGroupSource::Result{
                                   true, {}, g,
                                   {Member("run/l0.q_proj.weight", {1, 2, 3, 4}, g),
                                    Member("run/l0.k_proj.weight", {1, 2, 3, 4}, g)}});
  groups_.results.emplace("b", ExportGroupSource::Result{
                                   true, {}, 896, {Member("run/l0.q_proj.weight", {1, 2, 3, 4}, 896)}});
  const absl::StatusOr<std::string> two = Export("compressed-tensors");
  EXPECT_CODE(two, kPrecondition);
  EXPECT_TRUE(absl::StrContains(two.status().message(),
                                "run/l0.q_proj.weight is a member of the GLOBAL_AMAX scale groups a "
                                "and b, whose global scales differ (2688 and 896)"))
      << two.status();
}

// ---------------------------------------------------------------- the service

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(server_->address()));
  }

  // A weight session of `channels` per-channel int8 scales, observed once.
  void CreateObserved(const std::string& name, int64_t channels) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.mutable_spec()->mutable_granularity()->mutable_per_channel()->set_axis(0);
    ASSERT_OK(client_->CreateSession(request));
    std::vector<double> values(channels * 2);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i) - 7.25;
    ASSERT_OK(client_->Observe(name, F32({channels, 2}, values).view()));
  }

  // An NVFP4 session of `convention` (global_minmax): a weight in blocks of 16 along
  // its last axis, or an activation in the tuple form [-1, 16].
  void CreateNvfp4(const std::string& name, const std::string& convention, bool weight) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator("global_minmax");
    v1::QuantSpec& spec = *request.mutable_spec();
    spec.set_dtype("float4_e2m1fn_x2");
    spec.set_scale_dtype("float8_e4m3fn");
    spec.set_convention(convention);
    spec.set_target(weight ? v1::WEIGHT : v1::ACTIVATION);
    v1::PerBlock& blocks = *spec.mutable_granularity()->mutable_per_block();
    if (weight) {
      blocks.set_axis(-1);
      blocks.add_block_size(16);
    } else {
      blocks.add_block_size(-1);
      blocks.add_block_size(16);
    }
    ASSERT_OK(client_->CreateSession(request));
  }

  // nvfp4.md E1 and more: a [2, 32] weight whose block amaxes are 7, 3.5, 1 and 0,
  // and a [2, 32] input of amax 3.
  void CalibrateNvfp4Layer(const std::string& module, const std::string& convention) {
    CreateNvfp4(module + ".weight", convention, true);
    CreateNvfp4(module + ".input", convention, false);
    std::vector<double> w(64, 0.0);
    w[3] = -7;
    w[20] = 3.5;
    w[32 + 7] = 1;
    ASSERT_OK(client_->Observe(module + ".weight", F32({2, 32}, w).view()));
    std::vector<double> x(64);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i % 7) - 3;
    ASSERT_OK(client_->Observe(module + ".input", F32({2, 32}, x).view()));
  }

  // An NVFP4 weight [2, 32] of `convention` whose amax is `amax`.
  void CalibrateNvfp4Weight(const std::string& name, const std::string& convention,
                            double amax) {
    CreateNvfp4(name, convention, true);
    std::vector<double> w(64, 0.25);
    w[5] = -amax;
    ASSERT_OK(client_->Observe(name, F32({2, 32}, w).view()));
  }

  absl::StatusOr<std::string> Export(const std::string& prefix, const std::string& format,
                                     bool allow_uninitialized = false, int* messages = nullptr) {
    v1::ExportSessionsRequest request;
    request.set_prefix(prefix);
    request.set_format(format);
    request.set_allow_uninitialized(allow_uninitialized);
    std::string document;
    absl::Status status = client_->ExportSessions(request, [&](absl::string_view data) {
      document.append(data.data(), data.size());
      if (messages != nullptr) ++*messages;
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return document;
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

// Large exports span several messages whose concatenation is one JSON document.
// RenderExport over `requests` (sent in order, then the side closed): the document,
// or the call's status.
absl::StatusOr<std::string> Render(v1::QParamsService::Stub& stub,
                                   const std::vector<v1::RenderExportRequest>& requests) {
  grpc::ClientContext context;
  auto stream = stub.RenderExport(&context);
  for (const v1::RenderExportRequest& request : requests) {
    if (!stream->Write(request)) break;
  }
  stream->WritesDone();
  std::string document;
  v1::ExportChunk chunk;
  while (stream->Read(&chunk)) document += chunk.data();
  const grpc::Status status = stream->Finish();
  if (!status.ok()) return wire::FromGrpcStatus(status);
  return document;
}

// ExportSessions with `items` streams the server's share; RenderExport renders items
// into the document ExportSessions writes, and refuses what is not an export.
TEST_F(ExportTest, ItemsRenderTheDocumentAndRenderExportRefusesMisuse) {
  CreateObserved("ri/fc1.weight", 4);
  CreateObserved("ri/fc2.weight", 3);
  CalibrateNvfp4Layer("ri/nv/layers.0.mlp.down_proj", "compressed_tensors");
  std::unique_ptr<v1::QParamsService::Stub> stub = server_->NewStub();
  for (const auto& [prefix, format] : std::vector<std::pair<std::string, std::string>>{
           {"ri/fc", "aimet"}, {"ri/fc", "onnx"}, {"ri/nv/", "compressed-tensors"}}) {
    v1::ExportSessionsRequest request;
    request.set_prefix(prefix);
    request.set_format(format);
    request.set_items(true);
    std::vector<v1::RenderExportRequest> requests(1);
    *requests[0].mutable_options() = request;
    requests[0].mutable_options()->set_items(false);
    grpc::ClientContext context;
    auto reader = stub->ExportSessions(&context, request);
    v1::ExportChunk chunk;
    while (reader->Read(&chunk)) {
      EXPECT_TRUE(chunk.data().empty());
      v1::RenderExportRequest items;
      *items.mutable_items() = chunk.items();
      requests.insert(requests.begin() + 1, items);  // any order
    }
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_OK_AND_ASSIGN(const std::string expected, Export(prefix, format));
    ASSERT_OK_AND_ASSIGN(const std::string rendered, Render(*stub, requests));
    EXPECT_EQ(rendered, expected) << prefix << " " << format;
  }

  v1::RenderExportRequest options;
  options.mutable_options()->set_prefix("ri/");
  options.mutable_options()->set_format("onnx");
  v1::RenderExportRequest item;
  v1::ExportItem& one = *item.add_items();
  one.set_name("ri/x.weight");
  one.mutable_spec()->set_dtype("int8");  // not resolved: no quant range
  const std::vector<std::pair<std::vector<v1::RenderExportRequest>, std::string>> misuses = {
      {{}, "received no options"},
      {{item}, "first RenderExportRequest must carry"},
      {{options, options}, "only the first"},
      {{options, item}, "export item ri/x.weight: its spec is not resolved"},
  };
  for (const auto& [requests, needle] : misuses) {
    const absl::StatusOr<std::string> refused = Render(*stub, requests);
    EXPECT_CODE(refused, absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), needle)) << refused.status();
  }
  options.mutable_options()->set_items(true);
  EXPECT_CODE(Render(*stub, {options}), absl::StatusCode::kInvalidArgument);
  options.mutable_options()->set_items(false);
  EXPECT_CODE(Render(*stub, {options}), absl::StatusCode::kNotFound);
}

TEST_F(ExportTest, LargeExportsStreamAsOneDocument) {
  constexpr int kSessions = 300;
  for (int i = 0; i < kSessions; ++i) {
    CreateObserved(absl::StrCat("big/layer", 1000 + i, ".weight"), 64);
  }
  for (const std::string format : {"aimet", "onnx", "compressed-tensors"}) {
    int messages = 0;
    ASSERT_OK_AND_ASSIGN(const std::string document, Export("big", format, false, &messages));
    EXPECT_GT(messages, 2) << format << ": " << document.size() << " bytes";
    google::protobuf::Struct parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(document, &parsed).ok()) << format;
    if (format == "aimet") {
      EXPECT_EQ(parsed.fields().at("param_encodings").list_value().values_size(), kSessions);
      EXPECT_EQ(parsed.fields().at("activation_encodings").list_value().values_size(), 0);
    } else if (format == "onnx") {
      EXPECT_EQ(parsed.fields().at("encodings").list_value().values_size(), kSessions);
    } else {
      EXPECT_EQ(parsed.fields().at("tensors").struct_value().fields_size(), 2 * kSessions);
    }
  }
}

TEST_F(ExportTest, RefusesBeforeWritingAndListsUninitializedSessions) {
  CreateObserved("run/a.weight", 2);
  for (int i = 0; i < 23; ++i) {
    v1::CreateSessionRequest request;
    request.set_name(absl::StrCat("run/idle", 10 + i));
    ASSERT_OK(client_->CreateSession(request));
  }
  int messages = 0;
  const absl::StatusOr<std::string> refused = Export("run", "onnx", false, &messages);
  EXPECT_CODE(refused, kPrecondition);
  EXPECT_EQ(messages, 0);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "23 of the 24 sessions"))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "run/idle10, run/idle11"));
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "and 3 more"));
  ASSERT_OK_AND_ASSIGN(const std::string document, Export("run", "onnx", true));
  EXPECT_TRUE(absl::StrContains(document, "\"a.weight\""));
  EXPECT_FALSE(absl::StrContains(document, "idle"));
  EXPECT_CODE(Export("nothing", "onnx"), absl::StatusCode::kNotFound);
}

// tensor_names gives sessions the names of another tool's graph (e.g. ONNX's).
TEST_F(ExportTest, TensorNamesRenameTheExportedTensors) {
  CreateObserved("run/fc1.weight", 2);
  CreateObserved("run/fc2.weight", 2);
  auto export_with = [&](std::map<std::string, std::string> names) -> absl::StatusOr<std::string> {
    v1::ExportSessionsRequest request;
    request.set_prefix("run/");
    request.set_format("onnx");
    request.mutable_tensor_names()->insert(names.begin(), names.end());
    std::string document;
    absl::Status status = client_->ExportSessions(request, [&](absl::string_view data) {
      document.append(data.data(), data.size());
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
    return document;
  };
  ASSERT_OK_AND_ASSIGN(const std::string document,
                       export_with({{"fc1.weight", "/fc1/W \"q\""}, {"absent", "x"}}));
  EXPECT_TRUE(absl::StrContains(document, R"("name": "/fc1/W \"q\"")")) << document;
  EXPECT_TRUE(absl::StrContains(document, R"("name": "fc2.weight")")) << document;
  EXPECT_FALSE(absl::StrContains(document, R"("fc1.weight")")) << document;

  const absl::StatusOr<std::string> empty = export_with({{"fc1.weight", ""}});
  EXPECT_CODE(empty, kInvalid);
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "tensor_names[\"fc1.weight\"]"))
      << empty.status();
  const absl::StatusOr<std::string> clash = export_with({{"fc1.weight", "fc2.weight"}});
  EXPECT_CODE(clash, kInvalid);
  EXPECT_TRUE(absl::StrContains(clash.status().message(), "both export as fc2.weight"))
      << clash.status();
}

TEST_F(ExportTest, TwoSessionsWithOneTensorNameAreRefused) {
  CreateObserved("run/a", 2);
  CreateObserved("run.a", 2);
  const absl::StatusOr<std::string> refused = Export("run", "aimet");
  EXPECT_CODE(refused, kInvalid);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "run.a and run/a")) << refused.status();
}

TEST_F(ExportTest, CompressedTensorsGroupsModulesWithEqualArgs) {
  CreateObserved("run/fc1.weight", 2);
  CreateObserved("run/fc2.weight", 2);
  v1::CreateSessionRequest request;
  request.set_name("run/fc3.weight");
  request.mutable_spec()->set_dtype("uint8");
  request.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  ASSERT_OK(client_->CreateSession(request));
  ASSERT_OK(client_->Observe("run/fc3.weight", F32({2}, {-1, 3}).view()));
  ASSERT_OK_AND_ASSIGN(const std::string document, Export("run", "compressed-tensors"));
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(document, &parsed).ok()) << document;
  const auto& groups = parsed.fields()
                           .at("quantization_config")
                           .struct_value()
                           .fields()
                           .at("config_groups")
                           .struct_value()
                           .fields();
  ASSERT_EQ(groups.size(), 2u) << document;
  const auto targets = [&](const std::string& group) {
    std::vector<std::string> names;
    for (const auto& v :
         groups.at(group).struct_value().fields().at("targets").list_value().values()) {
      names.push_back(v.string_value());
    }
    return names;
  };
  EXPECT_EQ(targets("group_0"), (std::vector<std::string>{"fc1", "fc2"}));
  EXPECT_EQ(targets("group_1"), (std::vector<std::string>{"fc3"}));
}

// nvfp4.md section 6 through ExportSessions: both checkpoint forms of one layer, and
// the refusals of the convention the format does not hold and of mixed documents.
TEST_F(ExportTest, Nvfp4LayersInBothCheckpointForms) {
  CalibrateNvfp4Layer("ct/l0.q_proj", "compressed_tensors");
  CalibrateNvfp4Layer("mo/l0.q_proj", "modelopt");
  ASSERT_OK_AND_ASSIGN(const std::string ct, Export("ct", "compressed-tensors"));
  EXPECT_EQ(ct, R"({
  "tensors": {
    "l0.q_proj.input_global_scale": {"dtype": "float32", "shape": [1], "data": [896]},
    "l0.q_proj.weight_scale": {"dtype": "float8_e4m3fn", "shape": [2, 2], "data": [126, 118, 104, 32]},
    "l0.q_proj.weight_global_scale": {"dtype": "float32", "shape": [1], "data": [384.00003]}
  },
  "quantization_config": {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
      "group_0": {
        "targets": ["l0.q_proj"],
        "weights": {"num_bits": 4, "type": "float", "symmetric": true, "strategy": "tensor_group", "group_size": 16, "block_structure": null, "dynamic": false, "observer": "minmax", "scale_dtype": "torch.float8_e4m3fn"},
        "input_activations": {"num_bits": 4, "type": "float", "symmetric": true, "strategy": "tensor_group", "group_size": 16, "block_structure": null, "dynamic": "local", "observer": "minmax", "scale_dtype": "torch.float8_e4m3fn"},
        "output_activations": null
      }
    },
    "ignore": []
  }
}
)");
  ASSERT_OK_AND_ASSIGN(const std::string mo, Export("mo", "modelopt"));
  // The producer's version is the project's (CMakeLists.txt's project()).
  EXPECT_EQ(mo, R"({
  "tensors": {
    "l0.q_proj.input_scale": {"dtype": "float32", "shape": [], "data": [0.0011160715]},
    "l0.q_proj.weight_scale": {"dtype": "float8_e4m3fn", "shape": [2, 2], "data": [126, 118, 104, 56]},
    "l0.q_proj.weight_scale_2": {"dtype": "float32", "shape": [], "data": [0.0026041667]}
  },
  "hf_quant_config": {
    "producer": {"name": "qparams", "version": ")" QPARAMS_VERSION R"("},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": []}
  }
}
)");
  for (const auto& [prefix, format, reason] : std::vector<std::array<std::string, 3>>{
           {"ct", "modelopt", "--format=compressed-tensors"},
           {"mo", "compressed-tensors", "--format=modelopt"}}) {
    const absl::StatusOr<std::string> refused = Export(prefix, format);
    EXPECT_CODE(refused, kInvalid);
    EXPECT_TRUE(absl::StrContains(refused.status().message(), prefix + "/l0.q_proj"))
        << refused.status();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), reason)) << refused.status();
  }
  CreateObserved("ct/l1.weight", 2);
  const absl::StatusOr<std::string> mixed = Export("ct", "compressed-tensors");
  EXPECT_CODE(mixed, kInvalid);
  EXPECT_TRUE(absl::StrContains(mixed.status().message(), "ct/l1.weight (not NVFP4)"))
      << mixed.status();
  const absl::StatusOr<std::string> int8 = Export("ct/l1", "modelopt");
  EXPECT_CODE(int8, kInvalid);
  EXPECT_TRUE(absl::StrContains(int8.status().message(), "ct/l1.weight")) << int8.status();
}

TEST(FusedSiblings, TheTableOfNvfp4Section7UnderOneParent) {
  struct Case {
    std::string module;
    std::optional<std::pair<std::string, std::string>> slot;  // parent, set
  };
  for (const Case& c : std::vector<Case>{
           {"model.layers.0.self_attn.q_proj", {{"model.layers.0.self_attn", "attention"}}},
           {"l0.v_proj", {{"l0", "attention"}}},
           {"model.layers.3.mlp.up_proj", {{"model.layers.3.mlp", "MLP"}}},
           {"a.q_a_proj", {{"a", "MLA"}}},
           {"a.kv_a_proj_with_mqa", {{"a", "MLA"}}},
           {"mlp.experts.7.w3", {{"mlp.experts.7", "expert"}}},
           {"mlp.experts.7.w2", std::nullopt},
           {"l0.o_proj", std::nullopt},
           {"q_proj", {{"", "attention"}}},
           {"l0.q_proj_x", std::nullopt},
       }) {
    const std::optional<FusedSiblingSlot> slot = FusedSiblingOf(c.module);
    ASSERT_EQ(slot.has_value(), c.slot.has_value()) << c.module;
    if (!slot.has_value()) continue;
    EXPECT_EQ(slot->parent, c.slot->first) << c.module;
    EXPECT_EQ(FusedSiblingTable()[slot->set].what, c.slot->second) << c.module;
  }
}

// nvfp4.md section 7: fused siblings with different global scales and no group are
// refused in both NVFP4 forms, naming them and how to declare a group; siblings
// whose scales agree, and modules engines do not fuse, export.
TEST_F(ExportTest, Nvfp4FusedSiblingsMustShareTheirGlobalScale) {
  for (const auto& [convention, format] : std::vector<std::pair<std::string, std::string>>{
           {"compressed_tensors", "compressed-tensors"}, {"modelopt", "modelopt"}}) {
    const std::string run = convention + "/";
    CalibrateNvfp4Weight(run + "l0.self_attn.q_proj.weight", convention, 1);
    CalibrateNvfp4Weight(run + "l0.self_attn.k_proj.weight", convention, 3);
    CalibrateNvfp4Weight(run + "l0.self_attn.v_proj.weight", convention, 7);
    CalibrateNvfp4Weight(run + "l0.self_attn.o_proj.weight", convention, 5);
    CalibrateNvfp4Weight(run + "l0.mlp.gate_proj.weight", convention, 2);
    CalibrateNvfp4Weight(run + "l0.mlp.up_proj.weight", convention, 2);
    const absl::StatusOr<std::string> refused = Export(run, format);
    EXPECT_CODE(refused, kPrecondition);
    for (const char* needle :
         {"attention siblings under l0.self_attn,", "/l0.self_attn.q_proj.weight (",
          "/l0.self_attn.k_proj.weight (", "/l0.self_attn.v_proj.weight (", "GLOBAL_AMAX",
          "CreateScaleGroup"}) {
      EXPECT_TRUE(absl::StrContains(refused.status().message(), needle))
          << needle << " in " << refused.status();
    }
    EXPECT_FALSE(absl::StrContains(refused.status().message(), "o_proj")) << refused.status();
    EXPECT_FALSE(absl::StrContains(refused.status().message(), "gate_proj")) << refused.status();
    // Without the attention siblings (gate/up agree, o_proj fuses with nothing).
    ASSERT_OK(client_->DeleteSession(run + "l0.self_attn.k_proj.weight"));
    ASSERT_OK(client_->DeleteSession(run + "l0.self_attn.v_proj.weight"));
    EXPECT_OK(Export(run, format));
  }
}

// Through the service, the members of a GLOBAL_AMAX scale group export the group's
// global scale, so fused siblings that differ alone export one scale; a group with an
// uncalibrated member is refused naming it.
TEST_F(ExportTest, Nvfp4GroupMembersExportTheGroupsGlobalScale) {
  for (const auto& [convention, format, key] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"compressed_tensors", "compressed-tensors", "weight_global_scale"},
           {"modelopt", "modelopt", "weight_scale_2"}}) {
    const std::string run = "grouped-" + convention + "/";
    const std::vector<std::string> members = {run + "l0.self_attn.q_proj.weight",
                                              run + "l0.self_attn.k_proj.weight",
                                              run + "l0.self_attn.v_proj.weight"};
    CalibrateNvfp4Weight(members[0], convention, 1);
    CalibrateNvfp4Weight(members[1], convention, 3);
    CreateNvfp4(members[2], convention, true);
    std::unique_ptr<v1::QParamsService::Stub> stub = server_->NewStub();
    v1::CreateScaleGroupRequest create;
    create.mutable_group()->set_name(run + "qkv");
    for (const std::string& member : members) create.mutable_group()->add_members(member);
    create.mutable_group()->set_share(v1::ScaleGroup::GLOBAL_AMAX);
    v1::ScaleGroup group;
    grpc::ClientContext create_context;
    ASSERT_TRUE(stub->CreateScaleGroup(&create_context, create, &group).ok());

    const absl::StatusOr<std::string> refused = Export(run, format);
    EXPECT_CODE(refused, kPrecondition);
    EXPECT_TRUE(absl::StrContains(refused.status().message(), run + "qkv")) << refused.status();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "v_proj")) << refused.status();

    std::vector<double> w(64, 0.25);
    w[9] = 7;
    ASSERT_OK(client_->Observe(members[2], F32({2, 32}, w).view()));
    ASSERT_OK_AND_ASSIGN(const std::string document, Export(run, format));
    v1::GetGroupQParamsRequest get;
    get.set_name(run + "qkv");
    v1::GroupQParams shared;
    grpc::ClientContext get_context;
    ASSERT_TRUE(stub->GetGroupQParams(&get_context, get, &shared).ok());
    ASSERT_TRUE(shared.initialized());
    // Every member's global-scale tensor holds the group's one value.
    google::protobuf::Struct parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(document, &parsed).ok()) << document;
    const auto& tensors = parsed.fields().at("tensors").struct_value().fields();
    for (const std::string& member : members) {
      const std::string module = member.substr(run.size(), member.size() - run.size() - 7);
      const auto entry = tensors.find(module + "." + key);
      ASSERT_NE(entry, tensors.end()) << module << "." << key << " in " << document;
      const google::protobuf::Value& data = entry->second.struct_value().fields().at("data");
      const double exported =
          data.has_list_value() ? data.list_value().values(0).number_value() : data.number_value();
      EXPECT_EQ(static_cast<float>(exported), shared.global_scale()) << module;
    }
  }
}

// Histogram sessions export their qparams like any other per-tensor session: those
// GetQParams reads, computed by the export when no observation asked for them.
TEST_F(ExportTest, HistogramSessionsExportTheirQParams) {
  struct Made {
    std::string name, calculator, dtype;
    v1::QScheme qscheme;
    v1::Target target;
  };
  const std::vector<Made> sessions = {
      {"run/fc1.weight", "percentile", "int8", v1::SYMMETRIC, v1::WEIGHT},
      {"run/fc1.input", "entropy", "uint8", v1::ASYMMETRIC, v1::ACTIVATION},
      {"run/fc2.weight", "mse", "int4", v1::SYMMETRIC, v1::WEIGHT}};
  for (const Made& m : sessions) {
    v1::CreateSessionRequest request;
    request.set_name(m.name);
    request.set_calculator(m.calculator);
    request.mutable_spec()->set_dtype(m.dtype);
    request.mutable_spec()->set_qscheme(m.qscheme);
    request.mutable_spec()->set_target(m.target);
    request.mutable_histogram()->set_num_bins(256);
    ASSERT_OK(client_->CreateSession(request));
    std::vector<double> values = RandN(500, 7);
    if (m.qscheme == v1::ASYMMETRIC) {
      for (double& v : values) v = std::abs(v);
    }
    v1::ObserveRequest observe = TensorObservation(m.name, Vec(values).view());
    observe.set_omit_qparams(true);
    ASSERT_OK_AND_ASSIGN(std::vector<v1::ObserveResponse> responses,
                         client_->ObserveBatch({observe}));
    ASSERT_EQ(responses[0].status().code(), 0) << responses[0].status().message();
  }
  ASSERT_OK_AND_ASSIGN(const std::string document, Export("run", "onnx"));
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(document, &parsed).ok()) << document;
  const auto& encodings = parsed.fields().at("encodings").list_value().values();
  ASSERT_EQ(encodings.size(), sessions.size()) << document;
  for (const auto& encoding : encodings) {
    const auto& fields = encoding.struct_value().fields();
    const std::string name = absl::StrCat("run/", fields.at("name").string_value());
    ASSERT_OK_AND_ASSIGN(v1::GetQParamsResponse q, client_->GetQParams(name));
    ASSERT_TRUE(q.has_calibration()) << name;
    EXPECT_EQ(static_cast<float>(fields.at("y_scale").number_value()), q.qparams().scale(0))
        << name;
    EXPECT_EQ(fields.at("y_zero_point").number_value(), q.qparams().zero_point(0)) << name;
  }
  // AIMET and compressed-tensors carry the same scales, each under its own layout.
  std::map<std::string, float> aimet, compressed;
  ASSERT_OK_AND_ASSIGN(const std::string aimet_document, Export("run", "aimet"));
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(aimet_document, &parsed).ok())
      << aimet_document;
  for (const char* list : {"activation_encodings", "param_encodings"}) {
    for (const auto& encoding : parsed.fields().at(list).list_value().values()) {
      const auto& fields = encoding.struct_value().fields();
      aimet[absl::StrCat("run/", fields.at("name").string_value())] =
          static_cast<float>(fields.at("scale").list_value().values(0).number_value());
    }
  }
  ASSERT_OK_AND_ASSIGN(const std::string ct_document, Export("run", "compressed-tensors"));
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ct_document, &parsed).ok())
      << ct_document;
  const auto& tensors = parsed.fields().at("tensors").struct_value().fields();
  for (const Made& m : sessions) {
    const auto scale = tensors.find(absl::StrCat(m.name.substr(4), "_scale"));
    ASSERT_NE(scale, tensors.end()) << m.name << " in " << ct_document;
    compressed[m.name] = static_cast<float>(
        scale->second.struct_value().fields().at("data").list_value().values(0).number_value());
  }
  ASSERT_EQ(aimet.size(), sessions.size()) << aimet_document;
  for (const Made& m : sessions) {
    ASSERT_OK_AND_ASSIGN(v1::GetQParamsResponse q, client_->GetQParams(m.name));
    EXPECT_EQ(aimet[m.name], q.qparams().scale(0)) << m.name;
    EXPECT_EQ(compressed[m.name], q.qparams().scale(0)) << m.name;
  }
}

}  // namespace
}  // namespace qparams::testing
