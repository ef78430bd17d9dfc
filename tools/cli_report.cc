// The reports of the sessions under a prefix, each read as the sessions stream in
// (Client::ReadSessions): report, the coverage report (tools/report.h), and steps,
// a training run's step progress (tools/step_report.h).

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tools/cli_internal.h"
#include "tools/partial_file.h"
#include "tools/report.h"
#include "tools/step_report.h"

namespace qparams::cli {
namespace {

// `status` with "--html FILE: " before its message.
absl::Status ForHtml(const Options& options, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("--html ", options.html, ": ", status.message()));
}

}  // namespace

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

}  // namespace qparams::cli
