// Runs the NVFP4 vectors (Nvfp4VectorsPath(), nvfp4.md §10) through the core. The
// session cases run as the conformance vectors do, with whole tensors and with block
// ranges reduced beforehand; the qdq cases through the core's §5 helpers; the group
// cases (§4) through the domain's Engine, without gRPC.

#include <cstring>
#include <iostream>
#include <map>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/nvfp4.h"
#include "domain/engine.h"
#include "domain/recovery.h"
#include "gtest/gtest.h"
#include "tests/support/conformance_vectors.h"

namespace qparams::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

std::string CompareBytes(absl::string_view field, absl::string_view expected,
                         absl::string_view actual) {
  if (expected.size() != actual.size()) {
    return absl::StrCat(field, ": expected ", expected.size(), " bytes, got ", actual.size());
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i]) {
      return absl::StrFormat("%s: byte %d: expected 0x%02x, got 0x%02x", field, i,
                             static_cast<uint8_t>(expected[i]), static_cast<uint8_t>(actual[i]));
    }
  }
  return "";
}

std::vector<uint8_t> Codes(const Value& v) {
  std::vector<uint8_t> codes;
  for (int64_t c : IntList(v)) codes.push_back(static_cast<uint8_t>(c));
  return codes;
}

// The group cases' driver: a fresh memory-only Engine, tenant "".
class EngineDriver final : public GroupCaseDriver {
 public:
  absl::Status CreateSession(const std::string& name, const std::string& calculator,
                             const QuantSpec& spec,
                             std::optional<double> averaging_constant) override {
    return engine_.CreateSession("", name, calculator, spec, CalculatorOptions{averaging_constant})
        .status();
  }
  absl::StatusOr<QParams> Forward(const std::string& session, const Tensor& input) override {
    absl::StatusOr<TensorView> view = TensorView::Create(input.dtype, input.shape, input.data);
    if (!view.ok()) return view.status();
    ObserveOutcome outcome = engine_.Observe("", session, Observation::FromTensor(*view));
    if (!outcome.status.ok()) return outcome.status;
    return outcome.result.qparams;
  }
  absl::StatusOr<std::pair<QParams, bool>> GetQParams(const std::string& session) override {
    absl::StatusOr<CachedQParams> q = engine_.GetQParams("", session);
    if (!q.ok()) return q.status();
    return std::pair{q->qparams, q->initialized};
  }
  absl::Status SetGranularity(const std::string& session, const Granularity& g) override {
    return engine_.SetGranularity("", session, g).status();
  }
  absl::Status CreateGroup(const std::string& group, const std::vector<std::string>& members,
                           GroupShare share, bool fill_uncalibrated) override {
    return engine_.CreateScaleGroup("", {group, members, share, fill_uncalibrated}).status();
  }
  absl::StatusOr<GroupResult> GetGroupQParams(const std::string& group) override {
    return engine_.GetGroupQParams("", group);
  }
  std::string StateFingerprint() override {
    std::string out;
    for (const storage::v1::Record& r : EngineRecords::Of(engine_)) {
      storage::v1::Record copy = r;
      copy.mutable_put()->clear_update_time();  // reads touch nothing else
      out += copy.SerializeAsString();
    }
    absl::StatusOr<ScaleGroupPage> groups = engine_.ListScaleGroups("", Engine::kMaxPageSize, "", "");
    if (groups.ok()) {
      for (const ScaleGroupInfo& g : groups->groups) {
        absl::StrAppend(&out, "|", g.name, ":", absl::StrJoin(g.members, ","));
      }
    }
    return out;
  }

 private:
  Engine engine_;
};

// A qdq case (§10): "" on success, else what differed.
std::string RunQdqCase(const Struct& c) {
  absl::StatusOr<Nvfp4Convention> convention =
      ParseNvfp4Convention(Field(c, "convention")->string_value());
  if (!convention.ok()) return convention.status().ToString();
  absl::StatusOr<Tensor> input = ParseTensor(Field(c, "input")->struct_value());
  if (!input.ok()) return input.status().ToString();
  absl::StatusOr<TensorView> x = TensorView::Create(input->dtype, input->shape, input->data);
  if (!x.ok()) return x.status().ToString();
  const float global_scale =
      FloatFromBits(static_cast<uint32_t>(Field(c, "global_scale")->number_value()));
  const bool dynamic = Field(c, "mode")->string_value() == "dynamic";

  absl::StatusOr<std::vector<uint8_t>> codes =
      dynamic ? Nvfp4DynamicBlockCodes(*x, global_scale, *convention)
              : absl::StatusOr<std::vector<uint8_t>>(Codes(*Field(c, "scale_e4m3")));
  absl::StatusOr<Nvfp4QuantizedTensor> q =
      codes.ok() ? Nvfp4QuantizeDequantize(*x, *codes, global_scale, *convention)
                 : absl::StatusOr<Nvfp4QuantizedTensor>(codes.status());
  if (const Value* error = Field(c, "expect_error")) {
    absl::StatusOr<absl::StatusCode> code = ParseCode(error->string_value());
    if (!code.ok()) return code.status().ToString();
    return ErrorStepDifference(*code, q.status(), true);
  }
  if (!q.ok()) return absl::StrCat("status: expected ok, got ", q.status().ToString());
  const Struct& expect = Field(c, "expect")->struct_value();
  if (dynamic) {
    const std::vector<uint8_t> want = Codes(*Field(expect, "scale_e4m3"));
    const std::string d = CompareBytes(
        "scale_e4m3", absl::string_view(reinterpret_cast<const char*>(want.data()), want.size()),
        absl::string_view(reinterpret_cast<const char*>(codes->data()), codes->size()));
    if (!d.empty()) return d;
  }
  std::string packed, dequant;
  if (!absl::Base64Unescape(Field(expect, "packed")->string_value(), &packed) ||
      !absl::Base64Unescape(Field(expect, "dequant")->string_value(), &dequant)) {
    return "expect: packed or dequant is not base64";
  }
  if (std::string d = CompareBytes(
          "packed", packed,
          absl::string_view(reinterpret_cast<const char*>(q->packed.data()), q->packed.size()));
      !d.empty()) {
    return d;
  }
  return CompareBytes("dequant (float32 LE)", dequant,
                      absl::string_view(reinterpret_cast<const char*>(q->dequantized.data()),
                                        q->dequantized.size() * sizeof(float)));
}

TEST(Nvfp4Conformance, EveryCaseMatchesBitForBit) {
  const std::string path = Nvfp4VectorsPath();
  absl::StatusOr<std::vector<VectorCase>> cases = LoadVectors(path);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_FALSE(cases->empty()) << path << " holds no cases";

  int run = 0;
  int failed = 0;
  std::map<std::string, int> not_run;  // by kind
  for (const VectorCase& c : *cases) {
    if (c.kind == "qdq") {
      ++run;
      if (const std::string diff = RunQdqCase(c.json); !diff.empty()) {
        ++failed;
        ADD_FAILURE() << "case " << c.id << ": " << diff;
      }
      continue;
    }
    if (c.kind == "group") {
      ++run;
      EngineDriver driver;
      if (const std::string diff = RunGroupCase(c.json, driver); !diff.empty()) {
        ++failed;
        ADD_FAILURE() << "case " << c.id << ": " << diff;
      }
      continue;
    }
    if (!c.kind.empty()) {
      ++not_run[c.kind];
      continue;
    }
    ++run;
    if (const std::string failure = CoreCaseFailure(c); !failure.empty()) {
      ++failed;
      ADD_FAILURE() << failure;
    }
  }
  std::cout << "nvfp4 conformance: " << run - failed << " of " << run << " cases match\n";
  for (const auto& [kind, count] : not_run) {
    std::cout << "nvfp4 conformance: " << count << " " << kind << " cases not run in the core ("
              << path << ")\n";
  }
  EXPECT_GT(run, 0);
}

}  // namespace
}  // namespace qparams::testing
