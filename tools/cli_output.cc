#include "tools/cli_output.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/timestamp.h"
#include "core/scale_group.h"
#include "core/tensor.h"
#include "google/protobuf/util/json_util.h"
#include "proto/convert.h"
#include "proto/status.h"

namespace qparams::cli {
namespace {

using grpc::health::v1::HealthCheckResponse;

// `json` (protobuf's JSON mapping with whitespace: one field a line) without the
// lines of fields that only some results fill, when empty: QParams.scale_e4m3
// (NVFP4 results) and a merged listing's unreachable_replicas (a sharded
// deployment with a replica down). Printing every primitive field would otherwise
// show `"scaleE4m3": ""` on every other result and `"unreachableReplicas": []` on
// every listing. A field on the last line of its object takes the comma of the line
// before.
std::string OmitEmptyRareFields(const std::string& json) {
  constexpr absl::string_view kEmpty[] = {"\"scaleE4m3\": \"\"", "\"unreachableReplicas\": []"};
  std::string kept;
  kept.reserve(json.size());
  for (absl::string_view line : absl::StrSplit(json, '\n')) {
    const absl::string_view field = absl::StripLeadingAsciiWhitespace(line);
    bool omit = false;
    for (absl::string_view empty : kEmpty) {
      if (field == absl::StrCat(empty, ",")) omit = true;
      if (field == empty) {
        if (absl::EndsWith(kept, ",\n")) kept.erase(kept.size() - 2, 1);
        omit = true;
      }
    }
    if (!omit) absl::StrAppend(&kept, line, "\n");
  }
  return kept;
}

std::string Float(float value) { return absl::StrFormat("%.9g", value); }  // round-trips
std::string Bool(bool value) { return value ? "true" : "false"; }

// A histogram session's calibration line, nothing for other sessions.
void PrintCalibration(bool has, const v1::CalibrationResult& c, std::ostream& out) {
  if (!has) return;
  out << "calibration amax " << absl::StrFormat("%.17g", c.amax()) << "  bin_index "
      << c.bin_index() << "  exponent " << c.exponent() << "  total_count " << c.total_count();
  if (c.has_kl_margin()) out << "  kl_margin " << absl::StrFormat("%.6g", c.kl_margin());
  out << "\n";
}

// The summary line (with an NVFP4 result's global scale and amax when set), then one
// row per block (with its e4m3 code in hex when there are codes).
void PrintTable(const v1::QParams& qparams, std::ostream& out) {
  const Shape shape(qparams.shape().begin(), qparams.shape().end());
  out << "shape " << ShapeString(shape) << "  precision " << v1::DType_Name(qparams.precision());
  if (qparams.has_global_scale()) out << "  global_scale " << Float(qparams.global_scale());
  if (qparams.has_amax()) out << "  amax " << Float(qparams.amax());
  out << "\n";
  if (qparams.scale().empty()) return;
  const std::string& codes = qparams.scale_e4m3();
  std::vector<std::vector<std::string>> rows = {{"INDEX", "SCALE", "ZERO_POINT", "MINVAL"}};
  if (!codes.empty()) rows[0].push_back("SCALE_E4M3");
  Shape index(shape.size(), 0);
  for (int i = 0; i < qparams.scale_size(); ++i) {
    rows.push_back({ShapeString(index), Float(qparams.scale(i)),
                    i < qparams.zero_point_size() ? absl::StrCat(qparams.zero_point(i)) : "-",
                    i < qparams.minval_size() ? Float(qparams.minval(i)) : "-"});
    if (!codes.empty()) {
      rows.back().push_back(static_cast<size_t>(i) < codes.size()
                                ? absl::StrFormat("0x%02x", static_cast<uint8_t>(codes[i]))
                                : "-");
    }
    for (size_t d = index.size(); d-- > 0;) {  // the next row-major index
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  PrintColumns(rows, out);
}

void PrintSessions(const google::protobuf::RepeatedPtrField<v1::Session>& sessions,
                   std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "CALCULATOR", "INITIALIZED", "EXPORT_MODE", "OBSERVATIONS", "UPDATED"}};
  for (const v1::Session& s : sessions) {
    rows.push_back({s.name(), s.calculator(), Bool(s.initialized()), Bool(s.export_mode()),
                    absl::StrCat(s.observation_count()),
                    absl::FormatTime(absl::RFC3339_sec, TimeFromTimestamp(s.update_time()),
                                     absl::UTCTimeZone())});
  }
  PrintColumns(rows, out);
}

// "global_amax" or "union_range" (core/scale_group.h), or the enum's name for a
// value the core does not know.
std::string ShareName(v1::ScaleGroup::Share share) {
  const std::optional<GroupShare> known = wire::GroupShareFromProto(share);
  return known ? std::string(GroupShareName(*known)) : v1::ScaleGroup::Share_Name(share);
}

void PrintGroups(const google::protobuf::RepeatedPtrField<v1::ScaleGroup>& groups,
                 std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "SHARE", "FILL_UNCALIBRATED", "MEMBERS", "CREATED"}};
  for (const v1::ScaleGroup& g : groups) {
    rows.push_back({g.name(), ShareName(g.share()), Bool(g.fill_uncalibrated()),
                    absl::StrJoin(g.members(), ","),
                    absl::FormatTime(absl::RFC3339_sec, TimeFromTimestamp(g.create_time()),
                                     absl::UTCTimeZone())});
  }
  PrintColumns(rows, out);
}

}  // namespace

void PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Fails only for messages with Any fields, which the contract does not use.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  json = OmitEmptyRareFields(json);
  while (absl::EndsWith(json, "\n\n")) json.pop_back();
  out << json;
  if (!absl::EndsWith(json, "\n")) out << "\n";
}

void PrintColumns(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c]);
      if (c + 1 < row.size()) line.append(widths[c] - row[c].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

std::string CodeName(const v1::RpcStatus& status) {
  return absl::StatusCodeToString(wire::FromRpcStatus(status).code());
}

void PrintTable(const v1::ComputeResponse& response, std::ostream& out) {
  PrintTable(response.qparams(), out);
}

void PrintTable(const v1::GetQParamsResponse& response, std::ostream& out) {
  out << "initialized " << Bool(response.initialized()) << "\n";
  PrintCalibration(response.has_calibration(), response.calibration(), out);
  PrintTable(response.qparams(), out);
}

void PrintTable(const v1::ObserveResponse& response, std::ostream& out) {
  out << CodeName(response.status());
  if (!response.status().message().empty()) out << ": " << response.status().message();
  out << " (observation_count " << response.observation_count() << ")\n";
  if (response.status().code() != 0) return;
  PrintCalibration(response.has_calibration(), response.calibration(), out);
  PrintTable(response.qparams(), out);
}

// The summary, then one row per non-empty bin with its magnitudes [k*2^e, (k+1)*2^e).
void PrintTable(const v1::HistogramObservation& h, std::ostream& out) {
  out << "num_bins " << h.num_bins() << "  exponent " << h.exponent() << "  bins "
      << h.counts_size() << "  zero_count " << h.zero_count() << "  negative_count "
      << h.negative_count() << "  nan/+inf/-inf " << h.nan_count() << "/" << h.posinf_count() << "/"
      << h.neginf_count() << "\n";
  if (h.has_min()) {
    out << "min " << absl::StrFormat("%.17g", h.min()) << "  max "
        << absl::StrFormat("%.17g", h.max()) << "\n";
  }
  std::vector<std::vector<std::string>> rows = {{"BIN", "FROM", "TO", "COUNT"}};
  for (int k = 0; k < h.counts_size(); ++k) {
    if (h.counts(k) == 0) continue;
    rows.push_back({absl::StrCat(k), absl::StrFormat("%.9g", std::ldexp(k, h.exponent())),
                    absl::StrFormat("%.9g", std::ldexp(k + 1, h.exponent())),
                    absl::StrCat(h.counts(k))});
  }
  if (rows.size() > 1) PrintColumns(rows, out);
}

void PrintTable(const v1::Session& session, std::ostream& out) {
  google::protobuf::RepeatedPtrField<v1::Session> one;
  *one.Add() = session;
  PrintSessions(one, out);
}

void PrintTable(const v1::ListSessionsResponse& response, std::ostream& out) {
  PrintSessions(response.sessions(), out);
  if (!response.next_page_token().empty()) {
    out << "more: --page_token=" << response.next_page_token() << "\n";
  }
}

void PrintTable(const v1::ListCalculatorsResponse& response, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {{"KEY", "STATEFUL", "DESCRIPTION"}};
  for (const v1::CalculatorInfo& c : response.calculators()) {
    rows.push_back({c.key(), Bool(c.stateful()), c.description()});
  }
  PrintColumns(rows, out);
}

void PrintTable(const v1::ScaleGroup& group, std::ostream& out) {
  google::protobuf::RepeatedPtrField<v1::ScaleGroup> one;
  *one.Add() = group;
  PrintGroups(one, out);
}

void PrintTable(const v1::ListScaleGroupsResponse& response, std::ostream& out) {
  PrintGroups(response.groups(), out);
}

// The group line and its uncalibrated members; then, GLOBAL_AMAX, the shared amax
// and global scale and each member's own amax and qparams (its block codes among
// them), or, UNION_RANGE, the union range and the one qparams.
void PrintTable(const v1::GroupQParams& result, std::ostream& out) {
  out << "group " << result.group() << "  initialized " << Bool(result.initialized()) << "\n";
  if (!result.uncalibrated().empty()) {
    out << "uncalibrated " << absl::StrJoin(result.uncalibrated(), ", ") << "\n";
  }
  if (!result.initialized()) return;
  if (result.members_size() > 0) {
    out << "amax " << Float(result.amax()) << "  global_scale " << Float(result.global_scale())
        << "\n";
    for (const v1::GroupMember& member : result.members()) {
      out << "member " << member.name()
          << (member.has_amax() ? absl::StrCat("  amax ", Float(member.amax())) : "  filled")
          << "\n";
      PrintTable(member.qparams(), out);
    }
    return;
  }
  out << "min " << Float(result.min()) << "  max " << Float(result.max()) << "\n";
  PrintTable(result.qparams(), out);
}

void PrintTable(const HealthCheckResponse& response, std::ostream& out) {
  out << HealthCheckResponse::ServingStatus_Name(response.status()) << "\n";
}

}  // namespace qparams::cli
