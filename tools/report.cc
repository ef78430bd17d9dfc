#include "tools/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json_string.h"
#include "google/protobuf/util/json_util.h"
#include "tools/report_text.h"

namespace qparams::report {
namespace internal {

std::string Float(double value) { return absl::StrFormat("%.9g", value); }  // a float round-trips

std::string Float(const std::optional<float>& value) {
  return value.has_value() ? Float(*value) : "-";
}

std::string Ratio(const ScaleSpread& spread) {
  return spread.max_over_min.has_value() ? Float(*spread.max_over_min) : "-";
}

}  // namespace internal

namespace {

using google::protobuf::RepeatedField;
using internal::Float;
using internal::Ratio;

// A spread value in JSON: infinities as protobuf's JSON mapping writes them (JSON has no
// number for them), null when unset.
template <typename T>
std::string JsonNumber(const std::optional<T>& value) {
  if (!value.has_value()) return "null";
  if (std::isinf(*value)) return *value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return Float(*value);
}

// The CLI's granularity syntax (cli.h ParseGranularity).
std::string GranularityText(const v1::Granularity& granularity) {
  switch (granularity.kind_case()) {
    case v1::Granularity::kPerChannel:
      return absl::StrCat("per_channel:", granularity.per_channel().axis());
    case v1::Granularity::kPerBlock: {
      const v1::PerBlock& block = granularity.per_block();
      if (block.has_axis() && block.block_size_size() == 1) {
        return absl::StrCat("per_block:", block.axis(), ":", block.block_size(0));
      }
      return absl::StrCat("per_block:", absl::StrJoin(block.block_size(), ","));
    }
    default:
      return "per_tensor";
  }
}

std::string SpecJson(const v1::QuantSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;  // snake_case, as the rest of the document
  std::string json;
  // Fails only for messages with Any fields, which the contract does not use.
  (void)google::protobuf::util::MessageToJsonString(spec, &json, options);
  return json;
}

std::vector<std::string> TableHeader() {
  return {"NAME",   "CALCULATOR", "SPEC",         "OBSERVATIONS", "INITIALIZED", "NON_FINITE",
          "SCALES", "SCALE_MIN",  "SCALE_MEDIAN", "SCALE_MAX",    "MAX/MIN"};
}

// The spread's cells: SCALES, SCALE_MIN, SCALE_MEDIAN, SCALE_MAX, MAX/MIN.
std::vector<std::string> SpreadCells(const ScaleSpread& spread) {
  return {absl::StrCat(spread.count), Float(spread.min), Float(spread.median), Float(spread.max),
          Ratio(spread)};
}

}  // namespace

void PrintColumns(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string line;
  for (const auto& row : rows) {
    line.clear();
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c]);
      if (c + 1 < row.size()) line.append(widths[c] - row[c].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

std::optional<ScaleSpread> SpreadOf(const v1::Session& session) {
  const RepeatedField<float>& scales = session.qparams().scale();
  if (scales.empty()) return std::nullopt;
  ScaleSpread spread;
  spread.count = scales.size();
  std::vector<float> ordered;  // every scale but NaN
  ordered.reserve(scales.size());
  for (const float s : scales) {
    if (!std::isnan(s)) ordered.push_back(s);
  }
  spread.nan = spread.count - static_cast<int64_t>(ordered.size());
  if (ordered.empty()) return spread;
  const auto [min, max] = std::minmax_element(ordered.begin(), ordered.end());
  spread.min = *min;
  spread.max = *max;
  const auto middle = ordered.begin() + static_cast<std::ptrdiff_t>((ordered.size() - 1) / 2);
  std::nth_element(ordered.begin(), middle, ordered.end());  // linear, not a sort
  spread.median = *middle;
  if (*spread.min != 0 && std::isfinite(*spread.min)) {
    spread.max_over_min = static_cast<double>(*spread.max) / static_cast<double>(*spread.min);
  }
  return spread;
}

int64_t NonFiniteCount(const v1::Session& session) {
  int64_t count = 0;
  for (const RepeatedField<float>* values :
       {&session.qparams().scale(), &session.qparams().minval(), &session.running_min(),
        &session.running_max()}) {
    count +=
        std::count_if(values->begin(), values->end(), [](float v) { return !std::isfinite(v); });
  }
  return count;
}

std::string SpecSummary(const v1::QuantSpec& spec) {
  const v1::QScheme qscheme =
      spec.qscheme() == v1::QSCHEME_UNSPECIFIED ? v1::SYMMETRIC : spec.qscheme();
  std::string summary = absl::StrCat(spec.dtype().empty() ? "int8" : spec.dtype(), " ",
                                     absl::AsciiStrToLower(v1::QScheme_Name(qscheme)), " ",
                                     GranularityText(spec.granularity()), " ",
                                     spec.target() == v1::ACTIVATION ? "activation" : "weight");
  if (!spec.scale_dtype().empty()) absl::StrAppend(&summary, " scale_dtype=", spec.scale_dtype());
  const v1::FloatRange& range = spec.float_range();
  if (range.has_min() || range.has_max()) {
    absl::StrAppend(&summary, " float_range=[", range.has_min() ? Float(range.min()) : "observed",
                    ", ", range.has_max() ? Float(range.max()) : "observed", "]");
  }
  return summary;
}

CoverageReport::CoverageReport(std::string prefix, Format format, std::iostream* plots,
                               std::ostream& out)
    : prefix_(std::move(prefix)), format_(format), plots_(plots), out_(out) {
  if (format_ == Format::kJson) {
    out_ << "{\n \"prefix\": " << JsonString(prefix_)
         << ",\n \"note\": " << JsonString(kNonFiniteNote) << ",\n \"sessions\": [";
  }
}

void CoverageReport::Add(const v1::Session& session, const v1::HistogramObservation* histogram) {
  const std::optional<ScaleSpread> spread = SpreadOf(session);
  const int64_t non_finite = NonFiniteCount(session);
  if (format_ == Format::kJson) AddJson(session, spread, non_finite);
  ++sessions_;
  if (!session.initialized()) {
    uninitialized_.push_back({session.name(), session.calculator(), SpecSummary(session.spec()),
                              session.observation_count(), non_finite});
    return;
  }
  if (format_ == Format::kTable) {
    std::vector<std::string> row = {session.name(),
                                    session.calculator(),
                                    SpecSummary(session.spec()),
                                    absl::StrCat(session.observation_count()),
                                    "true",
                                    absl::StrCat(non_finite)};
    if (spread.has_value()) {
      const std::vector<std::string> cells = SpreadCells(*spread);
      row.insert(row.end(), cells.begin(), cells.end());
    } else {
      row.insert(row.end(), 5, "-");
    }
    initialized_rows_.push_back(std::move(row));
  }
  if (plots_ != nullptr) AddPlot(session, histogram, spread, non_finite);
}

void CoverageReport::AddJson(const v1::Session& session, const std::optional<ScaleSpread>& spread,
                             int64_t non_finite) {
  std::string scales = "null";
  if (spread.has_value()) {
    scales = absl::StrCat("{\"count\": ", spread->count, ", \"nan\": ", spread->nan,
                          ", \"min\": ", JsonNumber(spread->min),
                          ", \"median\": ", JsonNumber(spread->median),
                          ", \"max\": ", JsonNumber(spread->max),
                          ", \"max_over_min\": ", JsonNumber(spread->max_over_min), "}");
  }
  out_ << (sessions_ == 0 ? "\n  " : ",\n  ") << "{\"name\": " << JsonString(session.name())
       << ", \"calculator\": " << JsonString(session.calculator())
       << ", \"spec\": " << SpecJsonOf(session.spec())
       << ", \"spec_summary\": " << JsonString(SpecSummary(session.spec()))
       << ", \"initialized\": " << (session.initialized() ? "true" : "false")
       << ", \"observation_count\": " << session.observation_count() << ", \"shape\": ["
       << absl::StrJoin(session.qparams().shape(), ", ") << "], \"non_finite\": " << non_finite
       << ", \"scales\": " << scales << "}";
}

const std::string& CoverageReport::SpecJsonOf(const v1::QuantSpec& spec) {
  std::string key = spec.SerializeAsString();
  auto it = spec_json_.find(key);
  if (it != spec_json_.end()) return it->second;
  if (spec_json_.size() >= kSpecJsonCacheSize) spec_json_.clear();
  return spec_json_.emplace(std::move(key), SpecJson(spec)).first->second;
}

void CoverageReport::Finish() {
  const int64_t initialized = sessions_ - static_cast<int64_t>(uninitialized_.size());
  if (format_ == Format::kJson) {
    std::vector<std::string> names;
    names.reserve(uninitialized_.size());
    for (const Uninitialized& u : uninitialized_) names.push_back(JsonString(u.name));
    out_ << (sessions_ == 0 ? "" : "\n ") << "],\n \"uninitialized\": ["
         << absl::StrJoin(names, ", ") << "],\n \"session_count\": " << sessions_
         << ",\n \"initialized_count\": " << initialized << "\n}\n";
    return;
  }
  std::vector<std::vector<std::string>> rows;
  rows.reserve(1 + uninitialized_.size() + initialized_rows_.size());
  rows.push_back(TableHeader());
  for (const Uninitialized& u : uninitialized_) {
    std::vector<std::string> row = {u.name,  u.calculator,
                                    u.spec,  absl::StrCat(u.observations),
                                    "false", absl::StrCat(u.non_finite)};
    row.insert(row.end(), 5, "-");
    rows.push_back(std::move(row));
  }
  for (std::vector<std::string>& row : initialized_rows_) rows.push_back(std::move(row));
  initialized_rows_.clear();
  PrintColumns(rows, out_);
  out_ << sessions_ << " sessions under prefix " << JsonString(prefix_) << ": " << initialized
       << " initialized, " << uninitialized_.size() << " uninitialized\n"
       << kNonFiniteNote << ".\n";
}

}  // namespace qparams::report
