#include "client/cli.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "client/npy.h"
#include "client/partial_file.h"
#include "client/replica_router.h"
#include "client/report.h"
#include "client/reshard.h"
#include "client/slot_map_push.h"
#include "client/step_report.h"
#include "common/file.h"
#include "common/json_string.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "common/timestamp.h"
#include "core/dtype.h"
#include "core/granularity.h"
#include "core/histogram.h"
#include "core/histogram_params.h"
#include "core/range.h"
#include "core/registry.h"
#include "core/scale_group.h"
#include "google/protobuf/util/json_util.h"
#include "proto/convert.h"
#include "proto/status.h"

namespace qparams::cli {
namespace {

using grpc::health::v1::HealthCheckResponse;

// ---------------------------------------------------------------- output

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

// Rows of cells in aligned columns, the first row being the header.
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

std::string Float(float value) { return absl::StrFormat("%.9g", value); }  // round-trips
std::string Bool(bool value) { return value ? "true" : "false"; }
// The name of a stream item's status code, "OK" included.
std::string CodeName(const v1::RpcStatus& status) {
  return absl::StatusCodeToString(wire::FromRpcStatus(status).code());
}

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

// ---------------------------------------------------------------- commands

// One run of a command: its arguments, the flags, a client, and where output goes.
class Invocation {
 public:
  Invocation(std::vector<std::string> args, const Options& options, std::unique_ptr<Client> client,
             ClientOptions client_options, std::ostream& out, std::ostream& err)
      : args_(std::move(args)),
        options_(options),
        client_(std::move(client)),
        client_options_(std::move(client_options)),
        out_(out),
        err_(err) {}

  const std::string& arg(size_t i) const { return args_[i]; }
  size_t arg_count() const { return args_.size(); }
  const Options& options() const { return options_; }
  Client& client() { return *client_; }
  // Another client, of `target`, with this one's options (TLS, token, timeout).
  absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target) const {
    return Client::Connect(target, client_options_);
  }
  // The options client() was made with (TLS, token, timeout), for further clients.
  const ClientOptions& client_options() const { return client_options_; }
  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }
  bool table() const { return options_.format == "table"; }
  // The dtype .npy files are read as (--dtype).
  std::optional<DType> dtype() const {
    if (options_.dtype.empty()) return std::nullopt;
    return *ParseDType(options_.dtype);  // Run checked it
  }

  // Reports a failed call or file; returns the exit status: kExitIncomplete for a
  // merged read that could not read some replicas (after what it printed).
  int Fail(const absl::Status& status) {
    err_ << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
         << "\n";
    return UnreachableReplicas(status).empty() ? kExitFailed : kExitIncomplete;
  }

  template <typename Message>
  void Print(const Message& message) {
    if (table()) {
      PrintTable(message, out_);
    } else {
      PrintJson(message, out_);
    }
  }

  // kExitOk, or, when `unreachable` names replicas a merged page could not read,
  // their names on stderr and kExitIncomplete.
  int FailIfIncomplete(const google::protobuf::RepeatedPtrField<std::string>& unreachable) {
    if (unreachable.empty()) return kExitOk;
    return Fail(IncompleteError(std::vector<std::string>(unreachable.begin(), unreachable.end())));
  }

  // Prints `result`'s value, or reports its error; returns the exit status.
  template <typename Message>
  int PrintResult(const absl::StatusOr<Message>& result) {
    if (!result.ok()) return Fail(result.status());
    Print(*result);
    return kExitOk;
  }

 private:
  const std::vector<std::string> args_;
  const Options& options_;
  const std::unique_ptr<Client> client_;
  const ClientOptions client_options_;
  std::ostream& out_;
  std::ostream& err_;
};

// Reports a command-line mistake; returns the exit status.
int Usage(std::ostream& err, absl::string_view message) {
  err << "error: INVALID_ARGUMENT: " << message << "\n";
  return kExitUsage;
}

int Calculators(Invocation& in) { return in.PrintResult(in.client().ListCalculators()); }

int Compute(Invocation& in) {
  absl::StatusOr<v1::QuantSpec> spec = BuildSpec(in.options().spec);
  if (!spec.ok()) return Usage(in.err(), spec.status().message());
  absl::StatusOr<Tensor> tensor = ReadNpy(in.arg(0), in.dtype());
  if (!tensor.ok()) return in.Fail(tensor.status());
  absl::StatusOr<v1::QParams> qparams =
      in.client().Compute(in.options().calculator, *spec, tensor->view());
  if (!qparams.ok()) return in.Fail(qparams.status());
  v1::ComputeResponse response;
  *response.mutable_qparams() = *std::move(qparams);
  in.Print(response);
  return kExitOk;
}

int Create(Invocation& in) {
  absl::StatusOr<v1::QuantSpec> spec = BuildSpec(in.options().spec);
  if (!spec.ok()) return Usage(in.err(), spec.status().message());
  v1::CreateSessionRequest request;
  request.set_name(in.arg(0));
  request.set_calculator(in.options().calculator);
  *request.mutable_spec() = *std::move(spec);
  if (in.options().averaging_constant.has_value()) {
    request.set_averaging_constant(*in.options().averaging_constant);
  }
  absl::StatusOr<std::optional<v1::HistogramParams>> histogram =
      BuildHistogramParams(in.options().histogram);
  if (!histogram.ok()) return Usage(in.err(), histogram.status().message());
  if (histogram->has_value()) *request.mutable_histogram() = **histogram;
  return in.PrintResult(in.client().CreateSession(request));
}

int Get(Invocation& in) { return in.PrintResult(in.client().GetSession(in.arg(0))); }

int Delete(Invocation& in) {
  const absl::Status status = in.client().DeleteSession(in.arg(0));
  if (!status.ok()) return in.Fail(status);
  if (in.table()) {
    in.out() << "deleted " << in.arg(0) << "\n";
  } else {
    PrintJson(v1::DeleteSessionResponse(), in.out());
  }
  return kExitOk;
}

// One page; a page of a sharded deployment that could not read some replicas is
// printed, then they are named on stderr (kExitIncomplete).
int List(Invocation& in) {
  const Options& o = in.options();
  absl::StatusOr<v1::ListSessionsResponse> page =
      in.client().ListSessions(o.page_size, o.page_token, o.filter);
  if (!page.ok()) return in.Fail(page.status());
  in.Print(*page);
  return in.FailIfIncomplete(page->unreachable_replicas());
}

// `status` with "--html FILE: " before its message.
absl::Status ForHtml(const Options& options, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("--html ", options.html, ": ", status.message()));
}

// The report of the sessions under --prefix to stdout, rendered as they stream in;
// with --html FILE also the page, whole or not at all (PartialFile). The page file is
// opened before any session is read, so that a path that cannot be written fails at
// once. The plots wait in FILE.partial.plots, unlinked as soon as it is open (the
// stream keeps its data), so that no exit leaves it behind and the client holds one
// plot at a time, not the page. With a page, a histogram session's histogram is read
// (GetHistogram) for its plot.
int Report(Invocation& in) {
  const Options& options = in.options();
  std::optional<PartialFile> page;
  const std::string plots_path = absl::StrCat(options.html, ".partial.plots");
  std::fstream plots;
  if (!options.html.empty()) {
    page.emplace(options.html);
    if (const absl::Status opened = page->Open(); !opened.ok()) {
      return in.Fail(ForHtml(options, opened));
    }
    plots.open(plots_path, std::ios::binary | std::ios::in | std::ios::out | std::ios::trunc);
    const int open_errno = errno;
    if (!plots || std::remove(plots_path.c_str()) != 0) {
      const absl::Status status =
          ForHtml(options, absl::FailedPreconditionError(
                               absl::StrCat("cannot ", plots ? "remove " : "write ", plots_path,
                                            ": ", std::strerror(plots ? errno : open_errno))));
      plots.close();
      std::remove(plots_path.c_str());
      return in.Fail(status);
    }
  }
  report::CoverageReport coverage(options.prefix,
                                  in.table() ? report::Format::kTable : report::Format::kJson,
                                  plots.is_open() ? &plots : nullptr, in.out());
  // A replica that cannot be read leaves the others' sessions in the report, which is
  // printed, and is named on stderr (kExitIncomplete); the page, which has no place
  // to name it, is not written.
  absl::Status status = in.client().ReadSessions(options.prefix, [&](const v1::Session& session) {
    // The page plots a histogram session's histogram: one GetHistogram per such session,
    // read here as its session streams in, so that one histogram is held at a time.
    if (!page.has_value() || !session.initialized() || !session.has_histogram()) {
      coverage.Add(session);
      return absl::OkStatus();
    }
    const absl::StatusOr<v1::HistogramObservation> histogram =
        in.client().GetHistogram(session.name());
    if (histogram.ok()) {
      coverage.Add(session, &*histogram);
      return absl::OkStatus();
    }
    // Deleted, or replaced by a session of another calculator, since the stream read it:
    // plotted without its histogram, as the stream makes no snapshot either.
    if (absl::IsNotFound(histogram.status()) || absl::IsInvalidArgument(histogram.status())) {
      coverage.Add(session);
      return absl::OkStatus();
    }
    return absl::Status(
        histogram.status().code(),
        absl::StrCat("histogram of ", session.name(), ": ", histogram.status().message()));
  });
  const bool incomplete = !UnreachableReplicas(status).empty();
  if (status.ok() || incomplete) coverage.Finish();
  if (page.has_value() && status.ok()) {
    status = coverage.WriteHtml(page->stream());
    if (!status.ok()) {
      status =
          ForHtml(options, absl::DataLossError(absl::StrCat(plots_path, ": ", status.message())));
    } else if (const absl::Status committed = page->Commit(); !committed.ok()) {
      status = ForHtml(options, committed);
    }
  }
  return status.ok() ? kExitOk : in.Fail(status);
}

// The progress of the step-merged sessions under PREFIX ("" = every session), as
// they stream in (ReadSessions: sharded, every replica's, merged by name). A replica
// that cannot be read leaves the others' sessions printed, and is named on stderr
// (kExitIncomplete).
int Steps(Invocation& in) {
  const std::string prefix = in.arg_count() > 0 ? in.arg(0) : "";
  report::StepReport progress(prefix, in.table() ? report::Format::kTable : report::Format::kJson,
                              in.out());
  const absl::Status status = in.client().ReadSessions(prefix, [&](const v1::Session& session) {
    progress.Add(session);
    return absl::OkStatus();
  });
  if (status.ok() || !UnreachableReplicas(status).empty()) progress.Finish();
  return status.ok() ? kExitOk : in.Fail(status);
}

int GetQParams(Invocation& in) { return in.PrintResult(in.client().GetQParams(in.arg(0))); }

// Prints the histogram; with --output FILE its counts go to FILE as a uint64 .npy
// array instead of into what is printed.
int GetHistogram(Invocation& in) {
  absl::StatusOr<v1::HistogramObservation> histogram = in.client().GetHistogram(in.arg(0));
  if (!histogram.ok()) return in.Fail(histogram.status());
  if (!in.options().output.empty()) {
    const std::vector<uint64_t> counts(histogram->counts().begin(), histogram->counts().end());
    if (absl::Status written = WriteNpyUint64(in.options().output, counts); !written.ok()) {
      return in.Fail(written);
    }
    histogram->clear_counts();
  }
  in.Print(*histogram);
  return kExitOk;
}

// The observation of `tensor` reduced to its block minima and maxima under the
// session's granularity. A tensor that cannot be reduced (the granularity does not
// fit it, non-finite values, no elements) is sent whole instead: the server then
// judges it by the same rules as any other (export mode, for one, reads no values)
// and answers in its response.
v1::ObserveRequest ReducedObservation(const std::string& name, const TensorView& tensor,
                                      const Granularity& granularity, Target target) {
  absl::StatusOr<Shape> block = granularity.BlockShape(tensor.shape(), target);
  if (!block.ok()) return TensorObservation(name, tensor);
  absl::StatusOr<BlockRange> range = ObserveRange(tensor, *block);
  if (!range.ok()) return TensorObservation(name, tensor);
  return RangeObservation(name, tensor.shape(), range->min.view(), range->max.view());
}

// The observation of `tensor` binned here into a histogram session's histogram.
// A tensor that cannot be binned (non-finite values under nonfinite=reject, no
// elements) is sent whole, as ReducedObservation does.
v1::ObserveRequest BinnedObservation(const std::string& name, const TensorView& tensor,
                                     const HistogramParams& params) {
  absl::StatusOr<Histogram> histogram = BinTensor(
      tensor, params.num_bins.value_or(HistogramParams::kDefaultNumBins), params.nonfinite);
  if (!histogram.ok()) return TensorObservation(name, tensor);
  return HistogramObservation(name, *histogram);
}

int Observe(Invocation& in) {
  const std::string& name = in.arg(0);
  std::optional<Granularity> granularity;
  std::optional<HistogramParams> histogram;  // a histogram session's, with --reduce-locally
  Target target = Target::kWeight;
  if (in.options().reduce_locally) {
    absl::StatusOr<v1::Session> session = in.client().GetSession(name);
    if (!session.ok()) return in.Fail(session.status());
    if (session->has_histogram()) {
      absl::StatusOr<HistogramParams> params = wire::HistogramParamsFromProto(session->histogram());
      if (!params.ok()) return in.Fail(params.status());
      histogram = *std::move(params);
    } else {
      absl::StatusOr<Granularity> g =
          wire::GranularityFromProto(session->spec().granularity(), "session.spec.granularity");
      if (!g.ok()) return in.Fail(g.status());
      granularity = *std::move(g);
      target = wire::TargetFromProto(session->spec().target());
    }
  }

  // Each file becomes its request at once, so that only one file's tensor is held
  // twice at a time.
  std::vector<v1::ObserveRequest> requests;
  for (size_t i = 1; i < in.arg_count(); ++i) {
    absl::StatusOr<Tensor> tensor = ReadNpy(in.arg(i), in.dtype());
    if (!tensor.ok()) return in.Fail(tensor.status());
    requests.push_back(histogram.has_value() ? BinnedObservation(name, tensor->view(), *histogram)
                       : granularity.has_value()
                           ? ReducedObservation(name, tensor->view(), *granularity, target)
                           : TensorObservation(name, tensor->view()));
  }

  absl::StatusOr<std::vector<v1::ObserveResponse>> responses = in.client().ObserveStream(requests);
  if (!responses.ok()) return in.Fail(responses.status());
  int exit = kExitOk;
  for (size_t i = 0; i < responses->size(); ++i) {
    const v1::ObserveResponse& response = (*responses)[i];
    const std::string& file = in.arg(i + 1);
    if (in.table()) in.out() << file << ": ";
    in.Print(response);
    if (response.status().code() != 0) {
      in.err() << "error: " << CodeName(response.status()) << ": " << file << ": "
               << response.status().message() << "\n";
      exit = kExitFailed;
    }
  }
  return exit;
}

// Streams the document to stdout, or to -o FILE whole or not at all (PartialFile: a
// refusal leaves no file at all).
int Export(Invocation& in) {
  const Options& options = in.options();
  if (options.format == "json" || options.format == "table") {
    return Usage(in.err(),
                 "export needs --format=aimet, --format=onnx, "
                 "--format=compressed-tensors or --format=modelopt");
  }
  v1::ExportSessionsRequest request;
  request.set_prefix(options.prefix);
  request.set_format(options.format);
  request.set_allow_uninitialized(options.allow_uninitialized);
  if (options.output.empty()) {
    const absl::Status status = in.client().ExportSessions(request, [&](absl::string_view data) {
      in.out() << data;
      return absl::OkStatus();
    });
    in.out().flush();
    return status.ok() ? kExitOk : in.Fail(status);
  }
  PartialFile file(options.output);
  absl::Status status = in.client().ExportSessions(request, [&](absl::string_view data) {
    if (!file.is_open()) {  // only once the server has accepted the export
      if (absl::Status opened = file.Open(); !opened.ok()) return opened;
    }
    return file.Write(data);
  });
  if (status.ok() && file.is_open()) status = file.Commit();
  return status.ok() ? kExitOk : in.Fail(status);
}

int ExportMode(Invocation& in) {
  const std::string& mode = in.arg(1);
  if (mode != "on" && mode != "off") {
    return Usage(in.err(), absl::StrCat("export-mode takes on or off, not \"", mode, "\""));
  }
  return in.PrintResult(in.client().SetExportMode(in.arg(0), mode == "on"));
}

int SetGranularity(Invocation& in) {
  absl::StatusOr<v1::Granularity> granularity = ParseGranularity(in.arg(1));
  if (!granularity.ok()) {
    return Usage(in.err(), absl::StrCat("GRANULARITY: ", granularity.status().message()));
  }
  return in.PrintResult(in.client().SetGranularity(in.arg(0), *granularity));
}

int Health(Invocation& in) {
  absl::StatusOr<HealthCheckResponse::ServingStatus> status =
      in.client().Health(in.arg_count() > 0 ? in.arg(0) : "");
  if (!status.ok()) return in.Fail(status.status());
  HealthCheckResponse response;
  response.set_status(*status);
  in.Print(response);
  return *status == HealthCheckResponse::SERVING ? kExitOk : kExitFailed;
}

// The hash tag of `name` that is hashed for its slot, or nullopt for a name that
// hashes whole (common/slot.h).
std::optional<absl::string_view> HashTag(absl::string_view name) {
  const absl::string_view part = HashedPart(name);
  if (part.size() == name.size()) return std::nullopt;
  return part;
}

// The slot of each name (common/slot.h), computed here: no call to the server. A
// name with a hash tag shows the tag, the part that is hashed (and sent in the
// routing header).
int Slot(Invocation& in) {
  bool tagged = false;
  for (size_t i = 0; i < in.arg_count(); ++i) tagged = tagged || HashTag(in.arg(i)).has_value();
  if (in.table()) {
    std::vector<std::vector<std::string>> rows = {{"NAME", "SLOT"}};
    if (tagged) rows[0].push_back("HASHED_PART");
    for (size_t i = 0; i < in.arg_count(); ++i) {
      rows.push_back({in.arg(i), absl::StrCat(SlotOf(in.arg(i)))});
      if (tagged) rows.back().push_back(std::string(HashTag(in.arg(i)).value_or("-")));
    }
    PrintColumns(rows, in.out());
    return kExitOk;
  }
  in.out() << "{\n \"slots\": [";
  for (size_t i = 0; i < in.arg_count(); ++i) {
    in.out() << (i == 0 ? "\n  " : ",\n  ") << "{\"name\": " << JsonString(in.arg(i))
             << ", \"slot\": " << SlotOf(in.arg(i));
    if (const std::optional<absl::string_view> tag = HashTag(in.arg(i))) {
      in.out() << ", \"hashed_part\": " << JsonString(*tag);
    }
    in.out() << "}";
  }
  in.out() << "\n ]\n}\n";
  return kExitOk;
}

// ---------------------------------------------------------------- slot maps

// "NAME[=VALUE],...": the pieces; INVALID_ARGUMENT naming `flag` for an empty one.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> NamedList(
    absl::string_view flag, absl::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  if (text.empty()) return out;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(piece, absl::MaxSplits('=', 1));
    if (kv.first.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", text, "\" has an empty entry; separate entries by one comma"));
    }
    out.emplace_back(std::string(kv.first), std::string(kv.second));
  }
  return out;
}

// --haproxy_server's NAME=HOST:PORT[:CHECK_PORT] entries.
absl::StatusOr<std::vector<HaproxyServer>> HaproxyServers(absl::string_view text) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> entries =
      NamedList("--haproxy_server", text);
  if (!entries.ok()) return entries.status();
  std::vector<HaproxyServer> servers;
  for (const auto& [name, address] : *entries) {
    std::vector<std::string> parts = absl::StrSplit(address, ':');
    HaproxyServer server{name, "", 0, 0};
    bool ok = parts.size() == 2 || parts.size() == 3;
    if (ok) {
      server.host = parts[0];
      ok = !server.host.empty() && absl::SimpleAtoi(parts[1], &server.port) && server.port > 0 &&
           server.port <= 65535 &&
           (parts.size() == 2 || (absl::SimpleAtoi(parts[2], &server.check_port) &&
                                  server.check_port > 0 && server.check_port <= 65535));
    }
    if (!ok || !SlotMap::ValidReplicaName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--haproxy_server: \"", name, "=", address,
          "\" is not NAME=HOST:PORT[:CHECK_PORT] (an IPv4 address or a name, ports 1 to 65535)"));
    }
    servers.push_back(std::move(server));
  }
  return servers;
}

// Gives the map FILE to the replicas (SetSlotMap), then to HAProxy (runtime API), and
// prints what each took: JSON, or a table of WHERE and STATUS.
int SlotMapPush(Invocation& in) {
  const Options& o = in.options();
  absl::StatusOr<std::string> text = ReadFile(in.arg(0));
  if (!text.ok()) return in.Fail(text.status());
  absl::StatusOr<SlotMap> map = SlotMap::Parse(*text);
  if (!map.ok()) {
    return in.Fail(absl::InvalidArgumentError(absl::StrCat(in.arg(0), ": ", map.status().message())));
  }
  PushOptions push;
  push.target = o.target;
  push.client = in.client_options();
  push.haproxy_map = o.haproxy_map;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> replicas =
      NamedList("--replicas", o.replicas);
  if (!replicas.ok()) return Usage(in.err(), replicas.status().message());
  for (const auto& [name, target] : *replicas) {
    if (!SlotMap::ValidReplicaName(name)) {
      return Usage(in.err(), absl::StrCat("--replicas: \"", name,
                                          "\" is not a replica name ([a-zA-Z0-9._-]{1,64})"));
    }
    push.replicas.push_back({name, target});
  }
  if (!o.haproxy_admin.empty()) {
    for (absl::string_view admin : absl::StrSplit(o.haproxy_admin, ',')) {
      if (admin.empty()) return Usage(in.err(), "--haproxy_admin: an empty socket address");
      push.haproxy_admins.emplace_back(admin);
    }
  }
  absl::StatusOr<std::vector<HaproxyServer>> servers = HaproxyServers(o.haproxy_server);
  if (!servers.ok()) return Usage(in.err(), servers.status().message());
  push.haproxy_servers = *std::move(servers);
  if (!push.haproxy_servers.empty() && push.haproxy_admins.empty()) {
    return Usage(in.err(), "--haproxy_server needs --haproxy_admin");
  }
  absl::StatusOr<PushReport> report = PushSlotMap(*map, push);
  if (!report.ok()) {
    if (report.status().code() == absl::StatusCode::kInvalidArgument) {
      return Usage(in.err(), report.status().message());
    }
    return in.Fail(report.status());
  }
  auto describe = [](const absl::Status& status) {
    return status.ok() ? std::string("ok")
                       : absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                                      status.message());
  };
  if (in.table()) {
    std::vector<std::vector<std::string>> rows = {{"WHERE", "EPOCH", "STATUS"}};
    for (const PushReport::Replica& r : report->replicas) {
      rows.push_back({absl::StrCat("replica ", r.replica),
                      r.epoch >= 0 ? absl::StrCat(r.epoch) : "-", describe(r.status)});
    }
    for (const PushReport::Haproxy& h : report->haproxies) {
      rows.push_back({absl::StrCat("haproxy ", h.admin), h.status.ok() ? absl::StrCat(map->epoch()) : "-",
                      describe(h.status)});
    }
    PrintColumns(rows, in.out());
  } else {
    in.out() << "{\n \"epoch\": " << map->epoch() << ",\n \"replicas\": [";
    for (size_t i = 0; i < report->replicas.size(); ++i) {
      const PushReport::Replica& r = report->replicas[i];
      in.out() << (i == 0 ? "\n  " : ",\n  ") << "{\"replica\": " << JsonString(r.replica);
      if (r.epoch >= 0) in.out() << ", \"epoch\": " << r.epoch;
      if (!r.status.ok()) in.out() << ", \"error\": " << JsonString(describe(r.status));
      in.out() << "}";
    }
    in.out() << "\n ],\n \"haproxy\": [";
    for (size_t i = 0; i < report->haproxies.size(); ++i) {
      const PushReport::Haproxy& h = report->haproxies[i];
      in.out() << (i == 0 ? "\n  " : ",\n  ") << "{\"admin\": " << JsonString(h.admin)
               << ", \"map\": " << JsonString(h.map);
      if (!h.status.ok()) in.out() << ", \"error\": " << JsonString(describe(h.status));
      in.out() << "}";
    }
    in.out() << "\n ]\n}\n";
  }
  const absl::Status status = report->status();
  if (!status.ok()) return in.Fail(status);
  return kExitOk;
}

// The slot map the answering replica serves (GetTopology; --replica picks one):
// JSON, the Topology message; table, the map file's text, for `> slots.map`.
int SlotMapShow(Invocation& in) {
  absl::StatusOr<v1::Topology> topology = in.client().GetTopology();
  if (!topology.ok()) return in.Fail(topology.status());
  if (topology->replica_id().empty()) {
    return in.Fail(absl::FailedPreconditionError(
        "the server is not sharded (no --replica_id and --slot_map): it has no slot map"));
  }
  if (!in.table()) {
    PrintJson(*topology, in.out());
    return kExitOk;
  }
  std::vector<SlotMap::Range> ranges;
  for (const v1::SlotRange& range : topology->ranges()) {
    ranges.push_back({range.low(), range.high(), range.replica()});
  }
  absl::StatusOr<SlotMap> map = SlotMap::FromRanges(ranges, topology->epoch());
  if (!map.ok()) {
    return in.Fail(absl::InternalError(absl::StrCat(
        "replica ", topology->replica_id(), " answered a topology that is not a slot map: ",
        map.status().message())));
  }
  in.out() << map->ToText();
  return kExitOk;
}

// ---------------------------------------------------------------- scale groups

// The share --share names, by the core's names of the shares (global_amax,
// union_range), any case; nullopt for another.
std::optional<v1::ScaleGroup::Share> ParseShare(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (GroupShare share : {GroupShare::kGlobalAmax, GroupShare::kUnionRange}) {
    if (lower == GroupShareName(share)) return wire::GroupShareToProto(share);
  }
  return std::nullopt;
}

int GroupCreate(Invocation& in) {
  const Options& o = in.options();
  if (o.members.empty()) {
    return Usage(in.err(), "--members: group create needs the member sessions, --members=A,B,...");
  }
  v1::ScaleGroup group;
  group.set_name(in.arg(0));
  for (absl::string_view member : absl::StrSplit(o.members, ',')) {
    if (member.empty()) {
      return Usage(in.err(), absl::StrCat("--members: \"", o.members,
                                          "\" has an empty name; separate names by one comma"));
    }
    group.add_members(std::string(member));
  }
  if (o.share.empty()) {
    return Usage(in.err(), "--share: group create needs --share=global_amax or union_range");
  }
  const std::optional<v1::ScaleGroup::Share> share = ParseShare(o.share);
  if (!share) {
    return Usage(in.err(),
                 absl::StrCat("--share: \"", o.share, "\" is not global_amax or union_range"));
  }
  group.set_share(*share);
  group.set_fill_uncalibrated(o.fill_uncalibrated);
  return in.PrintResult(in.client().CreateScaleGroup(group));
}

int GroupGet(Invocation& in) { return in.PrintResult(in.client().GetScaleGroup(in.arg(0))); }

// Every group under --filter, following the pages (of --page_size) to the last:
// JSON, one ListScaleGroupsResponse holding them all.
int GroupList(Invocation& in) {
  const Options& o = in.options();
  if (!o.page_token.empty()) {
    return Usage(in.err(), "--page_token: group list follows every page; it takes none");
  }
  v1::ListScaleGroupsResponse all;
  const absl::Status status =
      in.client().ReadScaleGroups(o.filter, o.page_size, [&all](const v1::ScaleGroup& group) {
        *all.add_groups() = group;
        return absl::OkStatus();
      });
  const std::vector<std::string> unreachable = UnreachableReplicas(status);
  if (!status.ok() && unreachable.empty()) return in.Fail(status);
  all.mutable_unreachable_replicas()->Assign(unreachable.begin(), unreachable.end());
  in.Print(all);
  return status.ok() ? kExitOk : in.Fail(status);
}

int GroupDelete(Invocation& in) {
  const absl::Status status = in.client().DeleteScaleGroup(in.arg(0));
  if (!status.ok()) return in.Fail(status);
  if (in.table()) {
    in.out() << "deleted group " << in.arg(0) << "\n";
  } else {
    PrintJson(v1::DeleteScaleGroupResponse(), in.out());
  }
  return kExitOk;
}

int GroupQParams(Invocation& in) { return in.PrintResult(in.client().GetGroupQParams(in.arg(0))); }

// ---------------------------------------------------------------- reshard

// Moves slots LOW:HIGH from SOURCE to TARGET online (client/reshard.h), or resumes
// (--resume) or rolls back (--abort) the move under way. Each step goes to stderr;
// the result to stdout.
int Reshard(Invocation& in) {
  const Options& o = in.options();
  if (o.resume && o.abort) return Usage(in.err(), "--resume and --abort: give one or neither");
  ReshardPlan plan;
  const std::vector<absl::string_view> bounds = absl::StrSplit(in.arg(0), ':');
  if (bounds.size() != 2 || !absl::SimpleAtoi(bounds[0], &plan.low) ||
      !absl::SimpleAtoi(bounds[1], &plan.high)) {
    return Usage(in.err(), absl::StrCat("SLOTS: \"", in.arg(0), "\" is not LOW:HIGH"));
  }
  plan.source = in.arg(1);
  plan.target = in.arg(2);
  // Replicas named in --replica_addresses are reached directly; the others through
  // --target.
  std::map<std::string, std::unique_ptr<Client>> direct;
  if (!o.replica_addresses.empty()) {
    for (absl::string_view entry : absl::StrSplit(o.replica_addresses, ',')) {
      const std::vector<absl::string_view> pair = absl::StrSplit(entry, absl::MaxSplits('=', 1));
      if (pair.size() != 2 || pair[0].empty() || pair[1].empty()) {
        return Usage(in.err(), absl::StrCat("--replica_addresses: \"", entry,
                                            "\" is not NAME=HOST:PORT"));
      }
      absl::StatusOr<std::unique_ptr<Client>> client = in.Connect(std::string(pair[1]));
      if (!client.ok()) return Usage(in.err(), client.status().message());
      direct[std::string(pair[0])] = *std::move(client);
    }
  }
  auto client_of = [&](const std::string& replica) -> Client& {
    auto it = direct.find(replica);
    return it == direct.end() ? in.client() : *it->second;
  };
  ReshardOptions options;
  options.log = [&in](absl::string_view line) { in.err() << "reshard: " << line << "\n"; };
  if (!o.stop_before_switch) {
    // The target first, then the source, then every other replica the source's map
    // names (SetSlotMap, each addressed to its replica).
    options.switch_map = [&](const std::string& map_text) -> absl::Status {
      std::vector<std::string> order = {plan.target, plan.source};
      absl::StatusOr<v1::Topology> topology = client_of(plan.source).GetTopologyOf(plan.source);
      if (!topology.ok()) return topology.status();
      for (const std::string& replica : topology->replicas()) {
        if (replica != plan.target && replica != plan.source) order.push_back(replica);
      }
      for (const std::string& replica : order) {
        absl::StatusOr<v1::Topology> set = client_of(replica).SetSlotMapOf(replica, map_text);
        if (!set.ok()) {
          return absl::Status(set.status().code(), absl::StrCat(replica, ": SetSlotMap: ",
                                                                set.status().message()));
        }
        options.log(absl::StrCat(replica, ": slot map epoch ", set->epoch()));
      }
      // HAProxy last, once every replica took the map: it must not route a slot to
      // a replica that does not own it yet.
      if (o.haproxy_admin.empty()) return absl::OkStatus();
      absl::StatusOr<SlotMap> map = SlotMap::Parse(map_text);
      if (!map.ok()) return map.status();
      const std::vector<std::string> admins = absl::StrSplit(o.haproxy_admin, ',');
      if (absl::Status pushed = PushSlotMapToHaproxy(*map, admins, o.haproxy_map); !pushed.ok()) {
        return pushed;
      }
      options.log(absl::StrCat("HAProxy ", o.haproxy_admin, ": slot map epoch ", map->epoch()));
      return absl::OkStatus();
    };
  }
  const ReshardMode mode = o.resume  ? ReshardMode::kResume
                           : o.abort ? ReshardMode::kAbort
                                     : ReshardMode::kStart;
  absl::StatusOr<ReshardResult> result =
      qparams::Reshard(client_of(plan.source), client_of(plan.target), plan, mode, options);
  if (!result.ok()) return in.Fail(result.status());
  const absl::string_view outcome =
      result->outcome == ReshardResult::Outcome::kDone             ? "done"
      : result->outcome == ReshardResult::Outcome::kAwaitingSwitch ? "awaiting_switch"
                                                                   : "aborted";
  if (in.table()) {
    in.out() << "outcome " << outcome << "\nsessions_copied " << result->sessions_copied
             << "\ngroups_copied " << result->groups_copied << "\nsessions_dropped "
             << result->sessions_dropped << "\ncopy_seconds "
             << absl::ToDoubleSeconds(result->copy_time) << "\nfrozen_seconds "
             << absl::ToDoubleSeconds(result->frozen_time) << "\nnext_map\n"
             << result->next_map;
    return kExitOk;
  }
  in.out() << "{\n \"outcome\": \"" << outcome << "\",\n \"sessions_copied\": "
           << result->sessions_copied << ",\n \"groups_copied\": " << result->groups_copied
           << ",\n \"sessions_dropped\": " << result->sessions_dropped
           << ",\n \"copy_seconds\": " << absl::ToDoubleSeconds(result->copy_time)
           << ",\n \"frozen_seconds\": " << absl::ToDoubleSeconds(result->frozen_time)
           << ",\n \"next_map\": " << JsonString(result->next_map) << "\n}\n";
  return kExitOk;
}

struct Command {
  absl::string_view name;
  absl::string_view args;  // the synopsis of its arguments
  size_t min_args;
  size_t max_args;
  int (*run)(Invocation&);               // null for a command of subcommands
  absl::string_view help;                // "$CALCULATORS" stands for the session calculators
  const Command* subcommands = nullptr;  // `name SUBCOMMAND ARGS...`
  size_t subcommand_count = 0;
};

constexpr size_t kAny = SIZE_MAX;

// clang-format off
constexpr Command kSlotMapCommands[] = {
  {"push", "FILE", 1, 1, SlotMapPush,
   "Give every replica the slot map FILE (SetSlotMap, an admin call: --token an\n"
   "admin token of the servers' --admin_tokens_file), each addressed by name through\n"
   "--target: those --replicas names (NAME, or NAME=HOST:PORT to reach it straight),\n"
   "by default every replica FILE names and every replica of the current topology.\n"
   "Then, once every replica took it, replace the map of each --haproxy_admin\n"
   "HAProxy (runtime API: prepare map, add map, commit map; --haproxy_map names it,\n"
   "by default its only map); --haproxy_server spares are made ready first. A replica\n"
   "takes a map of a greater epoch (\"# epoch N\"); the same map again changes\n"
   "nothing. Prints what each took; exits 1 if any failed."},
  {"show", "", 0, 0, SlotMapShow,
   "Show the slot map the answering replica serves (GetTopology; through the\n"
   "balancer any healthy replica, else --replica's): JSON, the topology;\n"
   "--format=table, the map file's text (\"# epoch N\", then LOW:HIGH REPLICA\n"
   "lines), to keep the file in step with the maps pushed (qparams-cli slotmap\n"
   "show --format=table > FILE)."},
};

constexpr Command kGroupCommands[] = {
  {"create", "NAME --members=A,B,... --share=global_amax|union_range [--fill_uncalibrated]",
   1, 1, GroupCreate,
   "Create a scale group of existing sessions of one resolved spec. global_amax:\n"
   "NVFP4 members share one global scale from the largest member amax;\n"
   "union_range: per_tensor members share the qparams of the union of their\n"
   "ranges. --fill_uncalibrated (global_amax) gives uncalibrated members the\n"
   "group's global scale once one member is calibrated. Changes no member."},
  {"get", "NAME", 1, 1, GroupGet, "Show a scale group: members, share, fill_uncalibrated."},
  {"list", "[--filter=PREFIX] [--page_size=N]", 0, 0, GroupList,
   "Every scale group whose name starts with --filter, by name, following the\n"
   "pages (of --page_size) to the last."},
  {"delete", "NAME", 1, 1, GroupDelete, "Delete a scale group; never its members."},
  {"qparams", "NAME", 1, 1, GroupQParams,
   "The group's shared result from its members' current ranges: initialized, the\n"
   "uncalibrated members; global_amax: amax, global_scale and each member's amax\n"
   "and qparams (its e4m3 block codes); union_range: min, max and the one qparams."},
};
// clang-format on

// clang-format off
constexpr Command kCommands[] = {
  {"calculators", "", 0, 0, Calculators,
   "List the calculators: registry key, stateful or not, description."},
  {"compute", "FILE.npy", 1, 1, Compute,
   "The qparams of one tensor, stored nowhere. --calculator: \"\" (= dynamic),\n"
   "dynamic or static; and the spec flags."},
  {"create", "NAME", 1, 1, Create,
   "Create a session. --calculator, a session calculator of the registry:\n"
   "$CALCULATORS;\n"
   "or \"\" (= default: static for weights, moving_average for activations).\n"
   "--averaging_constant (moving_average only); the histogram flags (percentile,\n"
   "entropy, mse); and the spec flags."},
  {"get", "NAME", 1, 1, Get, "Show a session: spec, state and cached qparams."},
  {"list", "", 0, 0, List,
   "List sessions by name, one page at a time: --filter (a name prefix),\n"
   "--page_size, --page_token (from the previous page)."},
  {"report", "", 0, 0, Report,
   "A coverage report of the sessions under --prefix: per session its calculator,\n"
   "spec, observations, initialized, non-finite count and the spread of its scales\n"
   "(min, median, max, max/min); JSON, or --format=table with the uninitialized\n"
   "sessions first. --html=FILE also writes one self-contained page: the\n"
   "uninitialized sessions, then a plot of each other's per-channel or per-block\n"
   "ranges and scales, or of a percentile, entropy or mse session's histogram of\n"
   "|x| (log scale) with its amax and max |x| marked."},
  {"steps", "[PREFIX]", 0, 1, Steps,
   "The progress of a training run's step-merged sessions (docs/qat.md): for each\n"
   "session under PREFIX (all without it), by name, its last applied step, its open\n"
   "steps with the ranks they wait for, and the steps closed incomplete by their\n"
   "timeout with the ranks they were closed without; then a summary: sessions,\n"
   "stepped sessions, the least and greatest last applied step, the sessions with\n"
   "steps closed incomplete, the ranks missing from them and the ranks the open\n"
   "steps wait for. A session never stepped shows as such."},
  {"delete", "NAME", 1, 1, Delete, "Delete a session."},
  {"observe", "NAME FILE.npy [FILE.npy ...]", 2, kAny, Observe,
   "One forward of the session per file, in order, all over one stream.\n"
   "--reduce-locally sends each file's per-block min/max (reduced here under the\n"
   "session's granularity), or for a percentile, entropy or mse session its\n"
   "histogram (binned here), instead of the tensor: the same qparams, far fewer\n"
   "bytes. Prints every response; exits 1 if any failed."},
  {"qparams", "NAME", 1, 1, GetQParams,
   "A session's cached qparams (and a histogram session's calibration: amax,\n"
   "bin_index, exponent, total_count)."},
  {"histogram", "NAME", 1, 1, GetHistogram,
   "The histogram of |x| of a percentile, entropy or mse session: num_bins,\n"
   "exponent (bin k holds k*2^exponent <= |x| < (k+1)*2^exponent), counts, side\n"
   "counts, min, max. --output=FILE (-o) writes the counts to FILE as a .npy\n"
   "uint64 array (np.load(FILE)) and leaves them out of what is printed;\n"
   "--format=table lists the non-empty bins."},
  {"export", "", 0, 0, Export,
   "Every session under --prefix in a deployment format (--format=aimet: AIMET\n"
   "encodings 1.0.0; onnx: QuantizeLinear inputs, AIMET encodings 2.0.0's layout;\n"
   "compressed-tensors: scale tensors and quantization_config, NVFP4's too;\n"
   "modelopt: NVFP4 scale tensors and hf_quant_config.json), to -o FILE or\n"
   "stdout. Names lose the prefix. Fails listing the sessions that never saw data\n"
   "unless --allow-uninitialized leaves them out, and names any session the format\n"
   "cannot express. See docs/exports.md."},
  {"export-mode", "NAME on|off", 2, 2, ExportMode,
   "Freeze (on) or unfreeze (off) a session's qparams."},
  {"granularity", "NAME GRANULARITY", 2, 2, SetGranularity,
   "Change the granularity of a session that has not computed a forward yet."},
  {"health", "[SERVICE]", 0, 1, Health,
   "The health of the server (or of SERVICE, e.g. qparams.v1.QParamsService):\n"
   "SERVING, NOT_SERVING, ...; exits 0 only if SERVING. Sends no token."},
  {"slot", "NAME [NAME ...]", 1, kAny, Slot,
   "The slot of each session or group NAME (any string): zlib's CRC-32 of its\n"
   "hashed part mod 256, the hashed part being its hash tag (the characters\n"
   "between the first '{' and the first '}' after it, if any) or else the whole\n"
   "name; a name with a tag also shows it (hashed_part). Sessions are sharded by\n"
   "slot; the slot map says which replica owns each slot, hence the session.\n"
   "HAProxy routes on the same slot, from the routing header, which carries the\n"
   "hashed part: req.hdr(x-qparams-session),crc32,mod(256). Computed here: calls\n"
   "no server."},
  {"reshard",
   "LOW:HIGH SOURCE TARGET [--resume|--abort] [--stop_before_switch] "
   "[--replica_addresses=R=ADDR,...] [--haproxy_admin=SOCKET,...] [--haproxy_map=NAME]",
   3, 3, Reshard,
   "Move slots LOW:HIGH from replica SOURCE to replica TARGET online\n"
   "(docs/sharding.md, Moving slots online): TARGET imports them, SOURCE freezes\n"
   "their writes (UNAVAILABLE, retry), their sessions and groups are copied, the\n"
   "new slot map (epoch + 1) goes to TARGET, SOURCE and the other replicas\n"
   "(SetSlotMap), then each --haproxy_admin HAProxy (its runtime API), then both\n"
   "clear their states and SOURCE drops its copies.\n"
   "--stop_before_switch stops after the copy (outcome awaiting_switch, with\n"
   "next_map) for the operator to put the map in force; --resume continues a move,\n"
   "--abort rolls it back before its switch. Steps are printed on stderr. Needs an\n"
   "admin token of the replicas' --admin_tokens_file."},
  {"slotmap", "SUBCOMMAND [ARGS]", 0, 0, nullptr,
   "Slot maps of a sharded deployment (docs/sharding.md, \"Changing the topology\").\n"
   "Subcommands:",
   kSlotMapCommands, sizeof(kSlotMapCommands) / sizeof(kSlotMapCommands[0])},
  {"group", "SUBCOMMAND [ARGS]", 0, 0, nullptr,
   "Scale groups: named lists of sessions that share their scales\n"
   "(docs/scale_groups.md). A group routes by its name as a session does; sharded,\n"
   "name a group and its members with one hash tag ({layer0}.qkv). Subcommands:",
   kGroupCommands, sizeof(kGroupCommands) / sizeof(kGroupCommands[0])},
};
// clang-format on

// `parent` is the command of a subcommand, or null.
std::string Synopsis(const Command& command, const Command* parent = nullptr) {
  return absl::StrCat("qparams-cli [flags] ", parent != nullptr ? parent->name : "",
                      parent != nullptr ? " " : "", command.name,
                      command.args.empty() ? "" : absl::StrCat(" ", command.args));
}

// "static, moving_average, ... or mse": the registry's session calculators (those
// with a stateful factory), sorted by key.
std::string SessionCalculators() {
  std::vector<std::string> keys;
  for (const CalculatorClass* c : QParamsCalculatorRegistry::Global().ListRegistryValues()) {
    if (c->create_stateful != nullptr) keys.push_back(c->key);
  }
  if (keys.size() < 2) return absl::StrJoin(keys, "");
  const std::string last = keys.back();
  keys.pop_back();
  return absl::StrCat(absl::StrJoin(keys, ", "), " or ", last);
}

// `command`'s help, with the registry's session calculators in place of $CALCULATORS.
std::string Help(const Command& command) {
  return absl::StrReplaceAll(command.help, {{"$CALCULATORS", SessionCalculators()}});
}

const Command* Find(const Command* commands, size_t count, absl::string_view name) {
  for (size_t i = 0; i < count; ++i) {
    if (commands[i].name == name) return &commands[i];
  }
  return nullptr;
}

// "create, get, list, delete or qparams": the names of `command`'s subcommands.
std::string SubcommandNames(const Command& command) {
  std::vector<absl::string_view> names;
  for (size_t i = 0; i < command.subcommand_count; ++i) {
    names.push_back(command.subcommands[i].name);
  }
  const absl::string_view last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

}  // namespace

std::string CalculatorFlagHelp() {
  return absl::StrCat(
      "compute: \"\" (= dynamic), dynamic or static. create: \"\" (= default: static for "
      "weights, moving_average for activations), ",
      SessionCalculators());
}

std::string UsageMessage() {
  std::string usage =
      "Computes quantization parameters (scale, zero point, minval) on a qparams server.\n"
      "\n"
      "Usage: qparams-cli [flags] COMMAND [ARGS]\n"
      "\n"
      "Commands:\n";
  for (const Command& c : kCommands) {
    absl::StrAppend(&usage, "  ", c.name, c.args.empty() ? "" : " ", c.args, "\n      ",
                    absl::StrReplaceAll(Help(c), {{"\n", "\n      "}}), "\n");
    for (size_t i = 0; i < c.subcommand_count; ++i) {
      const Command& sub = c.subcommands[i];
      absl::StrAppend(&usage, "      ", c.name, " ", sub.name, sub.args.empty() ? "" : " ",
                      sub.args, "\n          ",
                      absl::StrReplaceAll(Help(sub), {{"\n", "\n          "}}), "\n");
    }
  }
  absl::StrAppend(
      &usage,
      "\n"
      "Every command takes --target, --format, --timeout, --retry_total and the\n"
      "connection flags.\n"
      "\n"
      "Connection: --tls connects over TLS and verifies the server against the\n"
      "system's root certificates; --tls_ca=FILE against the PEM roots in FILE\n"
      "instead. --tls_cert=FILE and --tls_key=FILE (both or neither) present a client\n"
      "certificate to a server that requires one (mutual TLS). Any of these three\n"
      "implies TLS. --tls_server_name=NAME checks the server's certificate for NAME\n"
      "instead of --target's host (e.g. localhost with --target=127.0.0.1:50051).\n"
      "--token=TOKEN (default: --token_file=FILE's content, else $QPARAMS_TOKEN) is\n"
      "sent as \"authorization: Bearer TOKEN\" on every call but health; prefer the\n"
      "file or the variable, as other users of the machine can see a command line. --replica=NAME addresses every call to that\n"
      "replica of a sharded deployment (through the balancer or straight to it)\n"
      "instead of routing each by its session.\n"
      "\n"
      "Spec flags (compute, create): --spec takes a whole QuantSpec in protobuf's JSON\n"
      "mapping, e.g. --spec='{\"dtype\": \"int4\", \"qscheme\": \"ASYMMETRIC\"}'; each of\n"
      "--quant_dtype, --qscheme, --granularity, --quant_target, --quant_min, --quant_max,\n"
      "--float_range_min, --float_range_max, --scale_dtype and --convention then\n"
      "overrides its field.\n"
      "\n"
      "Histogram flags (create, with --calculator=percentile, entropy or mse; unset =\n"
      "the default): --num_bins (a power of two in [256, 65536]; 4096), --percentile\n"
      "(percentile only, 0 < P <= 100; 99.99), --start_bin and --stride (entropy and\n"
      "mse only; 128 and 1), --skip_zeros (leave exact zeros out of the search),\n"
      "--nonfinite=reject|ignore (what NaN and +-Inf do; reject).\n"
      "\n"
      "GRANULARITY (--granularity and the granularity command):\n"
      "  per_tensor | per_channel:AXIS | per_block:AXIS:SIZE | per_block:B0,B1,...\n"
      "  (the last is multi-axis: one block size per dim, -1 = the whole dim).\n"
      "\n"
      ".npy files: float32, float16 or float64, little-endian, C order; bfloat16 as\n"
      "'<u2' or '<i2' bits with --dtype=bfloat16.\n"
      "\n"
      "Output: each response as JSON (protobuf's mapping; observe prints one document\n"
      "per file), or a short table with --format=table. Errors go to stderr as\n"
      "\"error: CODE: message\". Exit status: 0 success, 1 a failed call, file or\n"
      "observation, 2 a usage error. Flag names may use '-' for '_'.");
  return usage;
}

absl::Status NormalizeFlags(std::vector<std::string>& argv) {
  // absl's own flags, which ParseCommandLine handles itself.
  static const auto* const kBuiltin = new absl::flat_hash_set<absl::string_view>{
      "help",    "helpfull",        "helpshort", "helppackage", "helpon",     "helpmatch",
      "version", "only_check_args", "flagfile",  "fromenv",     "tryfromenv", "undefok"};
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string& arg = argv[i];
    if (arg == "--") break;                         // the rest is positional
    if (arg.size() < 2 || arg[0] != '-') continue;  // a positional argument
    if (arg == "-o" || absl::StartsWith(arg, "-o=")) arg.replace(0, 2, "--output");
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t equals = arg.find('=');
    const size_t end = equals == std::string::npos ? arg.size() : equals;
    std::replace(arg.begin() + start, arg.begin() + end, '-', '_');
    const std::string name = arg.substr(start, end - start);
    if (kBuiltin->contains(name)) continue;

    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {  // --noreduce_locally
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && equals == std::string::npos) {
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; run qparams-cli --help for the flags"));
    }
    std::string value;
    if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argv.size()) {
      value = argv[++i];  // "--flag value"
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    std::string error;  // names the flag
    if (!flag->ParseFrom(value, &error)) return absl::InvalidArgumentError(error);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Granularity> ParseGranularity(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  v1::Granularity granularity;
  if (parts.size() == 1 && parts[0] == "per_tensor") {
    granularity.mutable_per_tensor();
    return granularity;
  }
  int32_t axis;
  if (parts.size() == 2 && parts[0] == "per_channel" && absl::SimpleAtoi(parts[1], &axis)) {
    granularity.mutable_per_channel()->set_axis(axis);
    return granularity;
  }
  int64_t size;
  if (parts.size() == 3 && parts[0] == "per_block" && absl::SimpleAtoi(parts[1], &axis) &&
      absl::SimpleAtoi(parts[2], &size)) {
    granularity.mutable_per_block()->set_axis(axis);
    granularity.mutable_per_block()->add_block_size(size);
    return granularity;
  }
  if (parts.size() == 2 && parts[0] == "per_block") {
    v1::PerBlock* block = granularity.mutable_per_block();
    bool ok = true;
    for (absl::string_view s : absl::StrSplit(parts[1], ',')) {
      ok = ok && absl::SimpleAtoi(s, &size);
      block->add_block_size(size);
    }
    if (ok) return granularity;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text,
                   "\" is not per_tensor, per_channel:AXIS, per_block:AXIS:SIZE or "
                   "per_block:B0,B1,..."));
}

absl::StatusOr<v1::QuantSpec> BuildSpec(const SpecFlags& flags) {
  v1::QuantSpec spec;
  if (!flags.spec_json.empty()) {
    const auto status = google::protobuf::util::JsonStringToMessage(flags.spec_json, &spec);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--spec: not a QuantSpec in JSON: ",
                       absl::string_view(status.message().data(), status.message().size())));
    }
  }
  if (!flags.quant_dtype.empty()) {
    absl::StatusOr<QuantDType> dtype = ParseQuantDType(flags.quant_dtype);
    if (!dtype.ok()) {
      // The core names the spec field; here the flag is the name.
      return absl::InvalidArgumentError(absl::StrCat(
          "--quant_dtype: ", absl::StripPrefix(dtype.status().message(), "spec.dtype: ")));
    }
    spec.set_dtype(flags.quant_dtype);
  }
  if (!flags.qscheme.empty()) {
    v1::QScheme qscheme;
    if (!v1::QScheme_Parse(absl::AsciiStrToUpper(flags.qscheme), &qscheme) ||
        qscheme == v1::QSCHEME_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("--qscheme: \"", flags.qscheme,
                       "\" is not symmetric, asymmetric or symmetric_with_clipping"));
    }
    spec.set_qscheme(qscheme);
  }
  if (!flags.granularity.empty()) {
    absl::StatusOr<v1::Granularity> granularity = ParseGranularity(flags.granularity);
    if (!granularity.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--granularity: ", granularity.status().message()));
    }
    *spec.mutable_granularity() = *std::move(granularity);
  }
  if (!flags.target.empty()) {
    v1::Target target;
    if (!v1::Target_Parse(absl::AsciiStrToUpper(flags.target), &target) ||
        target == v1::TARGET_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("--quant_target: \"", flags.target, "\" is not weight or activation"));
    }
    spec.set_target(target);
  }
  if (flags.quant_min.has_value()) spec.set_quant_min(*flags.quant_min);
  if (flags.quant_max.has_value()) spec.set_quant_max(*flags.quant_max);
  if (flags.float_range_min.has_value()) {
    spec.mutable_float_range()->set_min(*flags.float_range_min);
  }
  if (flags.float_range_max.has_value()) {
    spec.mutable_float_range()->set_max(*flags.float_range_max);
  }
  // Passed as given: the server judges scale dtypes and conventions (nvfp4.md §2).
  if (!flags.scale_dtype.empty()) spec.set_scale_dtype(flags.scale_dtype);
  if (!flags.convention.empty()) spec.set_convention(flags.convention);
  return spec;
}

absl::StatusOr<std::optional<v1::HistogramParams>> BuildHistogramParams(
    const HistogramFlags& flags) {
  v1::HistogramParams params;
  if (flags.num_bins.has_value()) params.set_num_bins(*flags.num_bins);
  if (flags.percentile.has_value()) params.set_percentile(*flags.percentile);
  if (flags.start_bin.has_value()) params.set_start_bin(*flags.start_bin);
  if (flags.stride.has_value()) params.set_stride(*flags.stride);
  params.set_skip_zeros(flags.skip_zeros);
  if (!flags.nonfinite.empty()) {
    const std::string policy = absl::AsciiStrToLower(flags.nonfinite);
    if (policy != "reject" && policy != "ignore") {
      return absl::InvalidArgumentError(
          absl::StrCat("--nonfinite: \"", flags.nonfinite, "\" is not reject or ignore"));
    }
    params.set_nonfinite(policy == "ignore" ? v1::NONFINITE_IGNORE : v1::NONFINITE_REJECT);
  }
  // A given flag is on the wire (the optional fields by presence, --skip_zeros and
  // --nonfinite by a non-default value), so an empty message means none was given.
  if (params.ByteSizeLong() == 0) return std::nullopt;
  return params;
}

int Run(const std::vector<std::string>& args, const Options& options, std::ostream& out,
        std::ostream& err) {
  if (args.empty()) {
    return Usage(err, "no COMMAND given; run qparams-cli --help for the commands");
  }
  const Command* command = Find(kCommands, sizeof(kCommands) / sizeof(kCommands[0]), args[0]);
  if (command == nullptr) {
    return Usage(err, absl::StrCat("unknown command \"", args[0],
                                   "\"; run qparams-cli --help for the commands"));
  }
  const Command* parent = nullptr;
  size_t first_arg = 1;
  if (command->subcommand_count > 0) {
    const Command* sub =
        args.size() < 2 ? nullptr : Find(command->subcommands, command->subcommand_count, args[1]);
    if (sub == nullptr) {
      return Usage(
          err, absl::StrCat(args.size() < 2 ? "no SUBCOMMAND given"
                                            : absl::StrCat("unknown subcommand \"", args[1], "\""),
                            "; usage: ", Synopsis(*command), ", SUBCOMMAND being ",
                            SubcommandNames(*command), "; run qparams-cli --help for each"));
    }
    parent = command;
    command = sub;
    first_arg = 2;
  }
  std::vector<std::string> command_args(args.begin() + first_arg, args.end());
  if (command_args.size() < command->min_args || command_args.size() > command->max_args) {
    return Usage(err, absl::StrCat("usage: ", Synopsis(*command, parent)));
  }
  // export's --format names the export format instead.
  if (command->run != Export && options.format != "json" && options.format != "table") {
    return Usage(err, absl::StrCat("--format: \"", options.format, "\" is not json or table"));
  }
  if (!options.dtype.empty()) {
    absl::StatusOr<DType> dtype = ParseDType(options.dtype);
    if (!dtype.ok()) return Usage(err, absl::StrCat("--dtype: ", dtype.status().message()));
  }
  if (options.target.empty()) return Usage(err, "--target is empty");
  if (options.timeout <= absl::ZeroDuration()) {
    return Usage(err, absl::StrCat("--timeout must be positive, not ",
                                   absl::FormatDuration(options.timeout)));
  }
  if (options.retry_total < absl::ZeroDuration()) {
    return Usage(err, absl::StrCat("--retry_total must be >= 0, not ",
                                   absl::FormatDuration(options.retry_total)));
  }
  ClientOptions client_options;
  client_options.timeout = options.timeout;
  client_options.retry_total = options.retry_total;
  client_options.bearer_token = options.token;
  client_options.replica = options.replica;
  const bool tls = options.tls || !options.tls_ca.empty() || !options.tls_cert.empty() ||
                   !options.tls_key.empty();
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return Usage(err, "--tls_cert and --tls_key go together: give both or neither");
  }
  if (!tls && !options.tls_server_name.empty()) {
    return Usage(err, "--tls_server_name needs TLS (--tls, --tls_ca, --tls_cert or --tls_key)");
  }
  if (tls) {
    // A file that cannot be read, or holds no certificate or key, fails like a .npy
    // file that cannot be read.
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        TlsCredentials(options.tls_ca, options.tls_cert, options.tls_key);
    if (!credentials.ok()) {
      err << "error: " << absl::StatusCodeToString(credentials.status().code()) << ": "
          << credentials.status().message() << "\n";
      return kExitFailed;
    }
    client_options.credentials = *std::move(credentials);
    client_options.tls_server_name = options.tls_server_name;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options.target, client_options);
  if (!client.ok()) return Usage(err, client.status().message());
  Invocation invocation(std::move(command_args), options, *std::move(client), client_options, out,
                        err);
  return command->run(invocation);
}

}  // namespace qparams::cli
