#include "tests/support/histogram_vectors.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace qparams::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

absl::StatusOr<const Value*> Required(const Struct& s, const std::string& key) {
  const Value* v = Field(s, key);
  if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing key ", key));
  return v;
}

absl::StatusOr<uint64_t> RequiredUint64(const Struct& s, const std::string& key) {
  absl::StatusOr<const Value*> v = Required(s, key);
  if (!v.ok()) return v.status();
  absl::StatusOr<uint64_t> n = Uint64Of(**v);
  if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat(key, ": ", n.status().message()));
  return n;
}

// A double extreme: a C99 hex string, "inf", "-inf", "nan", or null (unset).
std::optional<double> Extreme(const Struct& s, const std::string& key) {
  const Value* v = Field(s, key);
  if (v == nullptr) return std::nullopt;
  return std::strtod(v->string_value().c_str(), nullptr);
}

absl::StatusOr<std::vector<uint64_t>> Counts(const Value& v) {
  std::vector<uint64_t> counts;
  if (v.kind_case() == Value::kListValue) {
    for (const Value& e : v.list_value().values()) {
      absl::StatusOr<uint64_t> c = Uint64Of(e);
      if (!c.ok()) return c.status();
      counts.push_back(*c);
    }
    return counts;
  }
  const Struct& sparse = v.struct_value();
  absl::StatusOr<uint64_t> length = RequiredUint64(sparse, "length");
  if (!length.ok()) return length.status();
  counts.assign(*length, 0);
  const Value* nonzero = Field(sparse, "nonzero");
  if (nonzero == nullptr) return counts;
  for (const Value& pair : nonzero->list_value().values()) {
    const auto& kc = pair.list_value().values();
    absl::StatusOr<uint64_t> k = kc.size() == 2 ? Uint64Of(kc[0]) : absl::InvalidArgumentError("");
    absl::StatusOr<uint64_t> c = kc.size() == 2 ? Uint64Of(kc[1]) : absl::InvalidArgumentError("");
    if (!k.ok() || !c.ok() || *k >= counts.size()) {
      return absl::InvalidArgumentError("counts.nonzero: pairs [k, c] with k < length");
    }
    counts[*k] = *c;
  }
  return counts;
}

absl::StatusOr<ExpectedCalibration> ParseCalibration(const Struct& e) {
  ExpectedCalibration x;
  if (const Value* v = Field(e, "amax_bits")) {
    absl::StatusOr<uint64_t> bits = Uint64Of(*v);
    if (!bits.ok()) return bits.status();
    x.amax_bits = *bits;
  }
  if (const Value* v = Field(e, "bin_index")) x.bin_index = static_cast<int64_t>(v->number_value());
  absl::StatusOr<const Value*> exponent = Required(e, "exponent");
  if (!exponent.ok()) return exponent.status();
  x.exponent = static_cast<int>((*exponent)->number_value());
  absl::StatusOr<uint64_t> total = RequiredUint64(e, "total_count");
  if (!total.ok()) return total.status();
  x.total_count = *total;
  return x;
}

absl::StatusOr<HistogramStep> ParseStep(const Struct& s) {
  HistogramStep step;
  const std::string op = Field(s, "op")->string_value();
  if (op == "forward") {
    step.op = HistogramStep::Op::kForward;
    absl::StatusOr<Tensor> input = ParseTensor(Field(s, "input")->struct_value());
    if (!input.ok()) return input.status();
    step.input = std::move(*input);
  } else if (op == "observe_histogram") {
    step.op = HistogramStep::Op::kObserveHistogram;
    absl::StatusOr<Histogram> h = ParseHistogram(Field(s, "histogram")->struct_value());
    if (!h.ok()) return h.status();
    step.histogram = std::move(*h);
  } else if (op == "get_qparams") {
    step.op = HistogramStep::Op::kGetQParams;
  } else if (op == "get_histogram") {
    step.op = HistogramStep::Op::kGetHistogram;
  } else if (op == "set_export_mode") {
    step.op = HistogramStep::Op::kSetExportMode;
    step.enabled = Field(s, "enabled")->bool_value();
  } else if (op == "set_granularity") {
    step.op = HistogramStep::Op::kSetGranularity;
    absl::StatusOr<Granularity> g = ParseGranularity(Field(s, "granularity")->struct_value());
    if (!g.ok()) return g.status();
    step.granularity = *g;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown op ", op));
  }
  if (const Value* e = Field(s, "expect")) {
    if (step.op == HistogramStep::Op::kGetHistogram) {
      absl::StatusOr<Histogram> h = ParseHistogram(e->struct_value());
      if (!h.ok()) return h.status();
      step.expect_histogram = std::move(*h);
    } else {
      step.expect = ParseExpect(e->struct_value());
      absl::StatusOr<ExpectedCalibration> c = ParseCalibration(e->struct_value());
      if (!c.ok()) return c.status();
      step.expect_calibration = *c;
    }
  }
  if (const Value* e = Field(s, "expect_error")) {
    absl::StatusOr<absl::StatusCode> code = ParseCode(e->string_value());
    if (!code.ok()) return code.status();
    step.expect_error = *code;
  }
  if (const Value* r = Field(s, "rule")) step.rule = r->string_value();
  return step;
}

absl::StatusOr<HistogramParams> ParseParams(const Struct& p) {
  HistogramParams params;
  if (const Value* v = Field(p, "num_bins")) params.num_bins = static_cast<int>(v->number_value());
  if (const Value* v = Field(p, "percentile")) params.percentile = v->number_value();
  if (const Value* v = Field(p, "start_bin")) params.start_bin = static_cast<int>(v->number_value());
  if (const Value* v = Field(p, "stride")) params.stride = static_cast<int>(v->number_value());
  if (const Value* v = Field(p, "skip_zeros")) params.skip_zeros = v->bool_value();
  return params;
}

absl::StatusOr<HistogramCase> ParseCase(const std::string& line) {
  absl::StatusOr<Struct> parsed = ParseJsonObject(line);
  if (!parsed.ok()) return parsed.status();
  const Struct& root = *parsed;
  HistogramCase c;
  c.id = Field(root, "id")->string_value();
  c.calculator = Field(root, "calculator")->string_value();
  absl::StatusOr<QuantSpec> spec = ParseSpec(Field(root, "spec")->struct_value());
  if (!spec.ok()) return spec.status();
  c.spec = *spec;
  if (const Value* p = Field(root, "histogram")) {
    absl::StatusOr<HistogramParams> params = ParseParams(p->struct_value());
    if (!params.ok()) return params.status();
    c.params = *params;
    if (const Value* v = Field(p->struct_value(), "nonfinite")) c.nonfinite = v->string_value();
  }
  if (const Value* g = Field(root, "group")) c.group = g->string_value();
  if (const Value* e = Field(root, "construct_error")) {
    absl::StatusOr<absl::StatusCode> code = ParseCode(e->string_value());
    if (!code.ok()) return code.status();
    c.construct_error = *code;
  }
  for (const Value& s : Field(root, "steps")->list_value().values()) {
    absl::StatusOr<HistogramStep> step = ParseStep(s.struct_value());
    if (!step.ok()) return step.status();
    c.steps.push_back(std::move(*step));
  }
  return c;
}

std::string ExtremeString(const std::optional<double>& v) {
  return v ? absl::StrFormat("%a", *v) : "null";
}

}  // namespace

std::string HistogramVectorsPath() {
  const char* env = std::getenv("QPARAMS_HISTOGRAM_VECTORS");
  return env != nullptr && *env != '\0' ? env : QPARAMS_DEFAULT_HISTOGRAM_VECTORS;
}

absl::StatusOr<Histogram> ParseHistogram(const Struct& s) {
  Histogram h;
  absl::StatusOr<const Value*> num_bins = Required(s, "num_bins");
  absl::StatusOr<const Value*> exponent = Required(s, "exponent");
  absl::StatusOr<const Value*> counts = Required(s, "counts");
  for (const auto* v : {&num_bins, &exponent, &counts}) {
    if (!v->ok()) return v->status();
  }
  h.num_bins = static_cast<int>((*num_bins)->number_value());
  h.exponent = static_cast<int>((*exponent)->number_value());
  absl::StatusOr<std::vector<uint64_t>> c = Counts(**counts);
  if (!c.ok()) return c.status();
  h.counts = std::move(*c);
  for (auto [key, field] : {std::pair{"zero_count", &h.zero_count},
                            std::pair{"negative_count", &h.negative_count},
                            std::pair{"nan_count", &h.nan_count},
                            std::pair{"posinf_count", &h.posinf_count},
                            std::pair{"neginf_count", &h.neginf_count}}) {
    absl::StatusOr<uint64_t> v = RequiredUint64(s, key);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  h.min = Extreme(s, "min");
  h.max = Extreme(s, "max");
  return h;
}

absl::StatusOr<std::vector<HistogramCase>> LoadHistogramVectors(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open histogram vectors file ", path));
  std::vector<HistogramCase> cases;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    absl::StatusOr<HistogramCase> c = ParseCase(line);
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": ", c.status().message()));
    }
    cases.push_back(std::move(*c));
  }
  return cases;
}

std::string HistogramDifference(const Histogram& expected, const Histogram& actual) {
  if (expected == actual) return "";
  if (expected.num_bins != actual.num_bins || expected.exponent != actual.exponent) {
    return absl::StrCat("num_bins/exponent: expected ", expected.num_bins, "/",
                        expected.exponent, ", got ", actual.num_bins, "/", actual.exponent);
  }
  if (expected.counts.size() != actual.counts.size()) {
    return absl::StrCat("counts: expected ", expected.counts.size(), " entries, got ",
                        actual.counts.size());
  }
  for (size_t k = 0; k < expected.counts.size(); ++k) {
    if (expected.counts[k] != actual.counts[k]) {
      return absl::StrCat("counts[", k, "]: expected ", expected.counts[k], ", got ",
                          actual.counts[k]);
    }
  }
  return absl::StrCat(
      "side counts or extrema: expected zero/negative/nan/+inf/-inf ", expected.zero_count, "/",
      expected.negative_count, "/", expected.nan_count, "/", expected.posinf_count, "/",
      expected.neginf_count, " min ", ExtremeString(expected.min), " max ",
      ExtremeString(expected.max), ", got ", actual.zero_count, "/", actual.negative_count, "/",
      actual.nan_count, "/", actual.posinf_count, "/", actual.neginf_count, " min ",
      ExtremeString(actual.min), " max ", ExtremeString(actual.max));
}

}  // namespace qparams::testing
