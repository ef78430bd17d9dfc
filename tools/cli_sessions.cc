// The commands of a session: create, get, list, delete, its qparams and histogram,
// export mode and granularity.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/cli_internal.h"
#include "tools/npy.h"

namespace qparams::cli {

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

}  // namespace qparams::cli
