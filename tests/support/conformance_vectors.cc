#include "tests/support/conformance_vectors.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/registry.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {

using google::protobuf::Struct;
using google::protobuf::Value;

namespace {

// A Struct holds JSON numbers as doubles; integers of 16 digits or more (counts and
// bit patterns up to 2^64) are quoted first, so that Uint64Of reads them exactly.
// Integers of 15 digits or fewer are below 2^53 and survive as doubles.
std::string QuoteLongIntegers(const std::string& json) {
  std::string out;
  out.reserve(json.size() + 64);
  bool in_string = false;
  for (size_t i = 0; i < json.size();) {
    const char c = json[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < json.size()) out += json[++i];
      if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') in_string = true;
    if (c != '-' && !std::isdigit(static_cast<unsigned char>(c))) {
      out += c;
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < json.size() && (std::isdigit(static_cast<unsigned char>(json[j])) ||
                               std::strchr("+-.eE", json[j]) != nullptr)) {
      ++j;
    }
    const std::string token = json.substr(i, j - i);
    const bool integer = token.find_first_of(".eE") == std::string::npos;
    const size_t digits = token.size() - (token[0] == '-' ? 1 : 0);
    out += integer && digits >= 16 ? absl::StrCat("\"", token, "\"") : token;
    i = j;
  }
  return out;
}

}  // namespace

absl::StatusOr<Struct> ParseJsonObject(const std::string& line) {
  Struct root;
  if (auto s = google::protobuf::util::JsonStringToMessage(QuoteLongIntegers(line), &root);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", s.ToString()));
  }
  return root;
}

absl::StatusOr<uint64_t> Uint64Of(const Value& v) {
  uint64_t out;
  if (v.kind_case() == Value::kStringValue) {
    if (absl::SimpleAtoi(v.string_value(), &out)) return out;
  } else if (v.kind_case() == Value::kNumberValue && v.number_value() >= 0 &&
             v.number_value() < 0x1.0p64) {
    return static_cast<uint64_t>(v.number_value());
  }
  return absl::InvalidArgumentError("expected an unsigned 64-bit integer");
}

const Value* Field(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end() || it->second.kind_case() == Value::kNullValue) return nullptr;
  return &it->second;
}

std::vector<int64_t> IntList(const Value& v) {
  std::vector<int64_t> out;
  for (const Value& e : v.list_value().values())
    out.push_back(static_cast<int64_t>(e.number_value()));
  return out;
}

absl::StatusOr<absl::StatusCode> ParseCode(const std::string& name) {
  if (name == "invalid_argument") return absl::StatusCode::kInvalidArgument;
  if (name == "failed_precondition") return absl::StatusCode::kFailedPrecondition;
  if (name == "resource_exhausted") return absl::StatusCode::kResourceExhausted;
  if (name == "already_exists") return absl::StatusCode::kAlreadyExists;
  if (name == "not_found") return absl::StatusCode::kNotFound;
  return absl::InvalidArgumentError(absl::StrCat("unknown error code ", name));
}

absl::StatusOr<Granularity> ParseGranularity(const Struct& g) {
  const Value* kind = Field(g, "kind");
  if (kind == nullptr) return absl::InvalidArgumentError("granularity without kind");
  const Value* axis = Field(g, "axis");
  if (kind->string_value() == "per_tensor") return Granularity::PerTensor();
  if (kind->string_value() == "per_channel") {
    return Granularity::PerChannel(static_cast<int64_t>(axis->number_value()));
  }
  if (kind->string_value() == "per_block") {
    const Value* sizes = Field(g, "block_size");
    std::optional<int64_t> a;
    if (axis != nullptr) a = static_cast<int64_t>(axis->number_value());
    return Granularity::PerBlock(a, sizes ? IntList(*sizes) : std::vector<int64_t>{});
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown granularity ", kind->string_value()));
}

absl::StatusOr<QuantSpec> ParseSpec(const Struct& s) {
  QuantSpec spec;
  spec.dtype = Field(s, "dtype")->string_value();
  absl::StatusOr<QScheme> qscheme = ParseQScheme(Field(s, "qscheme")->string_value());
  if (!qscheme.ok()) return qscheme.status();
  spec.qscheme = *qscheme;
  absl::StatusOr<Granularity> g = ParseGranularity(Field(s, "granularity")->struct_value());
  if (!g.ok()) return g.status();
  spec.granularity = *g;
  spec.target =
      Field(s, "target")->string_value() == "activation" ? Target::kActivation : Target::kWeight;
  if (const Value* v = Field(s, "quant_min")) spec.quant_min = v->number_value();
  if (const Value* v = Field(s, "quant_max")) spec.quant_max = v->number_value();
  if (const Value* fr = Field(s, "float_range")) {
    const auto& bounds = fr->list_value().values();
    if (bounds.size() != 2) return absl::InvalidArgumentError("float_range must have 2 entries");
    if (bounds[0].kind_case() == Value::kNumberValue)
      spec.float_range.min = bounds[0].number_value();
    if (bounds[1].kind_case() == Value::kNumberValue)
      spec.float_range.max = bounds[1].number_value();
  }
  if (const Value* v = Field(s, "scale_dtype")) spec.scale_dtype = v->string_value();
  if (const Value* v = Field(s, "convention")) spec.convention = v->string_value();
  return spec;
}

absl::StatusOr<Tensor> ParseTensor(const Struct& t) {
  Tensor tensor;
  absl::StatusOr<DType> dtype = ParseDType(Field(t, "dtype")->string_value());
  if (!dtype.ok()) return dtype.status();
  tensor.dtype = *dtype;
  tensor.shape = IntList(*Field(t, "shape"));
  std::string data;
  if (!absl::Base64Unescape(Field(t, "data")->string_value(), &data)) {
    return absl::InvalidArgumentError("input.data is not base64");
  }
  tensor.data = data;
  return tensor;
}

ExpectedQParams ParseExpect(const Struct& e) {
  ExpectedQParams x;
  x.shape = IntList(*Field(e, "shape"));
  for (int64_t v : IntList(*Field(e, "scale"))) x.scale.push_back(static_cast<uint32_t>(v));
  if (const Value* zp = Field(e, "zero_point")) {
    x.zero_point.emplace();
    for (int64_t v : IntList(*zp)) x.zero_point->push_back(static_cast<int32_t>(v));
  }
  if (const Value* mv = Field(e, "minval")) {
    x.minval.emplace();
    for (int64_t v : IntList(*mv)) x.minval->push_back(static_cast<uint32_t>(v));
  }
  if (const Value* init = Field(e, "initialized")) x.initialized = init->bool_value();
  if (const Value* codes = Field(e, "scale_e4m3")) {
    x.nvfp4 = true;
    for (int64_t v : IntList(*codes)) x.scale_e4m3.push_back(static_cast<uint8_t>(v));
    if (const Value* g = Field(e, "global_scale"))
      x.global_scale = static_cast<uint32_t>(g->number_value());
    if (const Value* a = Field(e, "amax")) x.amax = static_cast<uint32_t>(a->number_value());
  }
  return x;
}

namespace {

absl::StatusOr<VectorStep> ParseStep(const Struct& s) {
  VectorStep step;
  const std::string op = Field(s, "op")->string_value();
  if (op == "forward") {
    step.op = VectorStep::Op::kForward;
    absl::StatusOr<Tensor> input = ParseTensor(Field(s, "input")->struct_value());
    if (!input.ok()) return input.status();
    step.input = std::move(*input);
  } else if (op == "get_qparams") {
    step.op = VectorStep::Op::kGetQParams;
  } else if (op == "set_export_mode") {
    step.op = VectorStep::Op::kSetExportMode;
    step.enabled = Field(s, "enabled")->bool_value();
  } else if (op == "set_granularity") {
    step.op = VectorStep::Op::kSetGranularity;
    absl::StatusOr<Granularity> g = ParseGranularity(Field(s, "granularity")->struct_value());
    if (!g.ok()) return g.status();
    step.granularity = *g;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown op ", op));
  }
  if (const Value* e = Field(s, "expect")) step.expect = ParseExpect(e->struct_value());
  if (const Value* e = Field(s, "expect_error")) {
    absl::StatusOr<absl::StatusCode> code = ParseCode(e->string_value());
    if (!code.ok()) return code.status();
    step.expect_error = *code;
  }
  return step;
}

absl::StatusOr<VectorCase> ParseCase(const std::string& line) {
  absl::StatusOr<Struct> parsed = ParseJsonObject(line);
  if (!parsed.ok()) return parsed.status();
  const Struct& root = *parsed;
  VectorCase c;
  c.id = Field(root, "id")->string_value();
  if (const Value* kind = Field(root, "kind")) {
    c.kind = kind->string_value();
    c.json = root;
    return c;
  }
  c.calculator = Field(root, "calculator")->string_value();
  if (const Value* ac = Field(root, "averaging_constant"))
    c.averaging_constant = ac->number_value();
  absl::StatusOr<QuantSpec> spec = ParseSpec(Field(root, "spec")->struct_value());
  if (!spec.ok()) return spec.status();
  c.spec = *spec;
  if (const Value* e = Field(root, "construct_error")) {
    absl::StatusOr<absl::StatusCode> code = ParseCode(e->string_value());
    if (!code.ok()) return code.status();
    c.construct_error = *code;
  }
  for (const Value& s : Field(root, "steps")->list_value().values()) {
    absl::StatusOr<VectorStep> step = ParseStep(s.struct_value());
    if (!step.ok()) return step.status();
    c.steps.push_back(std::move(*step));
  }
  return c;
}

}  // namespace

std::string VectorsPath() {
  const char* env = std::getenv("QPARAMS_VECTORS");
  return env != nullptr && *env != '\0' ? env : QPARAMS_DEFAULT_VECTORS;
}

std::string Nvfp4VectorsPath() {
  const char* env = std::getenv("QPARAMS_NVFP4_VECTORS");
  return env != nullptr && *env != '\0' ? env : QPARAMS_DEFAULT_NVFP4_VECTORS;
}

absl::StatusOr<std::vector<VectorCase>> LoadVectors(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open vectors file ", path));
  std::vector<VectorCase> cases;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    absl::StatusOr<VectorCase> c = ParseCase(line);
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": ", c.status().message()));
    }
    cases.push_back(std::move(*c));
  }
  return cases;
}

std::string FirstDifference(const ExpectedQParams& expected, const QParams& actual,
                            std::optional<bool> actual_initialized) {
  if (expected.initialized.has_value() && actual_initialized != expected.initialized) {
    return absl::StrCat("initialized: expected ", *expected.initialized, ", got ",
                        actual_initialized.value_or(false));
  }
  if (expected.shape != actual.shape) {
    return absl::StrCat("shape: expected ", ShapeString(expected.shape), ", got ",
                        ShapeString(actual.shape));
  }
  auto compare_bits = [](absl::string_view field, const std::vector<uint32_t>& want,
                         const std::vector<float>& got) -> std::string {
    if (want.size() != got.size()) {
      return absl::StrCat(field, ": expected ", want.size(), " values, got ", got.size());
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (want[i] != FloatBits(got[i])) {
        return absl::StrFormat("%s[%d]: expected 0x%08x (%.9g), got 0x%08x (%.9g)", field, i,
                               want[i], FloatFromBits(want[i]), FloatBits(got[i]), got[i]);
      }
    }
    return "";
  };
  if (std::string d = compare_bits("scale", expected.scale, ScaleValues(actual)); !d.empty()) return d;
  if (expected.zero_point.has_value() != actual.has_zero_point) {
    return absl::StrCat("zero_point: expected ", expected.zero_point ? "values" : "null", ", got ",
                        actual.has_zero_point ? "values" : "null");
  }
  if (expected.zero_point.has_value()) {
    if (expected.zero_point->size() != actual.zero_point.size()) {
      return absl::StrCat("zero_point: expected ", expected.zero_point->size(), " values, got ",
                          actual.zero_point.size());
    }
    for (size_t i = 0; i < actual.zero_point.size(); ++i) {
      if ((*expected.zero_point)[i] != actual.zero_point[i]) {
        return absl::StrCat("zero_point[", i, "]: expected ", (*expected.zero_point)[i], ", got ",
                            actual.zero_point[i]);
      }
    }
  }
  if (expected.minval.has_value() != actual.has_minval) {
    return absl::StrCat("minval: expected ", expected.minval ? "values" : "null", ", got ",
                        actual.has_minval ? "values" : "null");
  }
  if (expected.minval.has_value()) {
    if (std::string d = compare_bits("minval", *expected.minval, actual.minval); !d.empty()) {
      return d;
    }
  }
  if (expected.scale_e4m3 != actual.scale_e4m3) {
    for (size_t i = 0; i < expected.scale_e4m3.size() && i < actual.scale_e4m3.size(); ++i) {
      if (expected.scale_e4m3[i] != actual.scale_e4m3[i]) {
        return absl::StrFormat("scale_e4m3[%d]: expected 0x%02x, got 0x%02x", i,
                               expected.scale_e4m3[i], actual.scale_e4m3[i]);
      }
    }
    return absl::StrCat("scale_e4m3: expected ", expected.scale_e4m3.size(), " codes, got ",
                        actual.scale_e4m3.size());
  }
  auto compare_optional = [](absl::string_view field, const std::optional<uint32_t>& want,
                             const std::optional<float>& got) -> std::string {
    if (want.has_value() != got.has_value()) {
      return absl::StrCat(field, ": expected ", want ? "a value" : "null", ", got ",
                          got ? "a value" : "null");
    }
    if (want.has_value() && *want != FloatBits(*got)) {
      return absl::StrFormat("%s: expected 0x%08x (%.9g), got 0x%08x (%.9g)", field, *want,
                             FloatFromBits(*want), FloatBits(*got), *got);
    }
    return "";
  };
  if (std::string d = compare_optional("global_scale", expected.global_scale, actual.global_scale);
      !d.empty()) {
    return d;
  }
  return compare_optional("amax", expected.amax, actual.amax);
}

std::string RunCoreCase(const VectorCase& c, ObservationMode mode) {
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
        if (mode == ObservationMode::kRange) {
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

std::string CoreCaseFailure(const VectorCase& c) {
  for (ObservationMode mode : {ObservationMode::kTensor, ObservationMode::kRange}) {
    const std::string diff = RunCoreCase(c, mode);
    if (diff.empty()) continue;
    return absl::StrCat("case ", c.id,
                        mode == ObservationMode::kRange ? " (range observations)" : "", ": ",
                        diff);
  }
  return "";
}

std::string ErrorStepDifference(absl::StatusCode expected, const absl::Status& status,
                                bool unchanged) {
  if (status.code() != expected) {
    return absl::StrCat("status: expected ", CodeName(expected), ", got ",
                        status.ok() ? "ok" : status.ToString());
  }
  if (!unchanged) return "state: a failed step changed the calculator";
  return "";
}

std::string CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return "ok";
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    case absl::StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case absl::StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case absl::StatusCode::kAlreadyExists:
      return "already_exists";
    case absl::StatusCode::kNotFound:
      return "not_found";
    default:
      return absl::StatusCodeToString(code);
  }
}

namespace {

std::string GroupResultDifference(const Struct& expect, const GroupResult& actual) {
  if (Field(expect, "initialized")->bool_value() != actual.initialized) {
    return absl::StrCat("initialized: expected ", !actual.initialized, ", got ",
                        actual.initialized);
  }
  std::vector<std::string> uncalibrated;
  if (const Value* u = Field(expect, "uncalibrated")) {
    for (const Value& v : u->list_value().values()) uncalibrated.push_back(v.string_value());
  }
  if (uncalibrated != actual.uncalibrated) {
    return absl::StrCat("uncalibrated: expected [", absl::StrJoin(uncalibrated, ", "), "], got [",
                        absl::StrJoin(actual.uncalibrated, ", "), "]");
  }
  if (!actual.initialized) return "";
  auto bits = [&](const char* key, float got) -> std::string {
    const uint32_t want = static_cast<uint32_t>(Field(expect, key)->number_value());
    if (want == FloatBits(got)) return "";
    return absl::StrFormat("%s: expected 0x%08x (%.9g), got 0x%08x (%.9g)", key, want,
                           FloatFromBits(want), FloatBits(got), got);
  };
  if (const Value* members = Field(expect, "members")) {
    if (std::string d = bits("amax", actual.amax); !d.empty()) return d;
    if (std::string d = bits("global_scale", actual.global_scale); !d.empty()) return d;
    const auto& want = members->list_value().values();
    if (want.size() != actual.members.size()) {
      return absl::StrCat("members: expected ", want.size(), ", got ", actual.members.size());
    }
    for (int i = 0; i < want.size(); ++i) {
      const Struct& m = want[i].struct_value();
      const GroupMemberResult& got = actual.members[i];
      if (Field(m, "name")->string_value() != got.name) {
        return absl::StrCat("members[", i, "].name: expected ", Field(m, "name")->string_value(),
                            ", got ", got.name);
      }
      ExpectedQParams e = ParseExpect(m);
      e.global_scale = FloatBits(actual.global_scale);  // every member carries the group's
      if (std::string d = FirstDifference(e, got.qparams); !d.empty()) {
        return absl::StrCat("members[", i, "] (", got.name, "): ", d);
      }
      if (got.amax != got.qparams.amax) return absl::StrCat("members[", i, "].amax differs");
    }
    return "";
  }
  if (std::string d = bits("min", actual.min); !d.empty()) return d;
  if (std::string d = bits("max", actual.max); !d.empty()) return d;
  if (std::string d = FirstDifference(ParseExpect(Field(expect, "qparams")->struct_value()),
                                      actual.qparams);
      !d.empty()) {
    return absl::StrCat("qparams: ", d);
  }
  return "";
}

}  // namespace

std::string RunGroupCase(const Struct& c, GroupCaseDriver& driver) {
  for (const Value& v : Field(c, "sessions")->list_value().values()) {
    const Struct& s = v.struct_value();
    absl::StatusOr<QuantSpec> spec = ParseSpec(Field(s, "spec")->struct_value());
    if (!spec.ok()) return spec.status().ToString();
    std::optional<double> averaging_constant;
    if (const Value* ac = Field(s, "averaging_constant")) averaging_constant = ac->number_value();
    if (absl::Status st = driver.CreateSession(Field(s, "name")->string_value(),
                                               Field(s, "calculator")->string_value(), *spec,
                                               averaging_constant);
        !st.ok()) {
      return absl::StrCat("creating session ", Field(s, "name")->string_value(), ": ",
                          st.ToString());
    }
  }
  const auto& steps = Field(c, "steps")->list_value().values();
  for (int i = 0; i < steps.size(); ++i) {
    const Struct& s = steps[i].struct_value();
    const std::string op = Field(s, "op")->string_value();
    const std::string where = absl::StrCat("step ", i, " (", op, ") ");
    std::optional<absl::StatusCode> expect_error;
    if (const Value* e = Field(s, "expect_error")) {
      absl::StatusOr<absl::StatusCode> code = ParseCode(e->string_value());
      if (!code.ok()) return code.status().ToString();
      expect_error = *code;
    }
    const std::string before = expect_error ? driver.StateFingerprint() : "";
    absl::Status status;
    std::string diff;
    if (op == "create_group" || op == "get_group_qparams") {
      const std::string group = Field(s, "group")->string_value();
      if (op == "create_group") {
        std::vector<std::string> members;
        for (const Value& m : Field(s, "members")->list_value().values()) {
          members.push_back(m.string_value());
        }
        const GroupShare share = Field(s, "share")->string_value() == "union_range"
                                     ? GroupShare::kUnionRange
                                     : GroupShare::kGlobalAmax;
        const Value* fill = Field(s, "fill_uncalibrated");
        status = driver.CreateGroup(group, members, share, fill != nullptr && fill->bool_value());
      } else {
        absl::StatusOr<GroupResult> r = driver.GetGroupQParams(group);
        status = r.status();
        if (r.ok() && !expect_error) {
          diff = GroupResultDifference(Field(s, "expect")->struct_value(), *r);
        }
      }
    } else {
      absl::StatusOr<VectorStep> step = ParseStep(s);
      if (!step.ok()) return absl::StrCat(where, step.status().ToString());
      const std::string session = Field(s, "session")->string_value();
      std::optional<QParams> result;
      std::optional<bool> initialized;
      switch (step->op) {
        case VectorStep::Op::kForward: {
          absl::StatusOr<QParams> q = driver.Forward(session, step->input);
          status = q.status();
          if (q.ok()) result = *std::move(q);
          break;
        }
        case VectorStep::Op::kGetQParams: {
          absl::StatusOr<std::pair<QParams, bool>> q = driver.GetQParams(session);
          status = q.status();
          if (q.ok()) {
            result = q->first;
            initialized = q->second;
          }
          break;
        }
        case VectorStep::Op::kSetGranularity:
          status = driver.SetGranularity(session, step->granularity);
          break;
        case VectorStep::Op::kSetExportMode:
          return absl::StrCat(where, "set_export_mode is not a group case op");
      }
      if (status.ok() && step->expect.has_value() && !expect_error) {
        diff = result.has_value() ? FirstDifference(*step->expect, *result, initialized)
                                  : "no qparams to compare";
      }
    }
    if (expect_error.has_value()) {
      if (std::string d = ErrorStepDifference(*expect_error, status,
                                              before == driver.StateFingerprint());
          !d.empty()) {
        return absl::StrCat(where, d);
      }
      continue;
    }
    if (!status.ok()) return absl::StrCat(where, "status: expected ok, got ", status.ToString());
    if (!diff.empty()) return absl::StrCat(where, diff);
  }
  return "";
}

}  // namespace qparams::testing
