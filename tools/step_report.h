// The progress of a training run's step-merged sessions (`qparams-cli steps`,
// docs/qat.md): the sessions under a prefix, as ReadSessions streams them, each with
// its last applied step, its open steps and the ranks they still wait for, and the
// steps closed incomplete by their timeout with the ranks they were closed without;
// then a summary of the run. A table, or one JSON document.
//
// Target qparams_report (tools/README.md): a tool, rendering Session messages it is
// given; it depends on the wire messages only, never on the RPC client.

#ifndef QPARAMS_TOOLS_STEP_REPORT_H_
#define QPARAMS_TOOLS_STEP_REPORT_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "qparams/v1/qparams.pb.h"
#include "tools/report.h"

namespace qparams::report {

// `ranks` in short: ascending, each run of consecutive ranks as FIRST-LAST, the runs
// comma-separated ("0-3,7"); "" for none. Repeated ranks count once.
std::string RankRanges(std::vector<int32_t> ranks);

// Renders the progress of the sessions Add() is given, in the order given
// (ReadSessions gives name order). Every session is listed; one that never took a
// step contribution (Session.steps unset: an ordinary session, a weight's, or one no
// rank has reached) shows as not stepped and is left out of the step summary.
//
// The table, one row per session:
//   NAME  LAST_APPLIED  OPEN  CLOSED_INCOMPLETE
// where OPEN lists the open steps as "STEPS waiting for RANKS" and CLOSED_INCOMPLETE
// the steps closed by their timeout as "STEPS missing RANKS" ("missing all" for a
// step nobody contributed to), consecutive steps of one world size and the same
// ranks as one FIRST-LAST entry, entries separated by "; ", "-" for none; then one
// summary line:
//   sessions N  stepped S  last_applied MIN..MAX  with_incomplete K  missing_ranks R
//   waiting_for_ranks Q
// (MIN..MAX over the stepped sessions, "-" without any; R the ranks any step was
// closed without, Q those the open steps wait for, as RankRanges, "-" for none).
//
// The JSON document: {"prefix", "sessions": [{"name", "stepped", "last_applied_step"
// (-1 before the first applied step, and for a session not stepped), "open":
// [{"step", "world_size", "waiting_for_ranks"}], "incomplete": [{"step",
// "world_size", "missing_ranks"}]}], "session_count", "stepped_count",
// "last_applied_step_min", "last_applied_step_max" (null without a stepped session),
// "sessions_with_incomplete_steps", "missing_ranks", "waiting_for_ranks"}, numbers
// as JSON numbers. The sessions go to `out` as they are added; the table at Finish().
//
// Memory: one short row per session for the table, and the summary's rank sets.
// Not thread-safe: one thread adds the sessions of one stream, then calls Finish().
class StepReport {
 public:
  // With JSON, writes the start of the document to `out` now.
  StepReport(std::string prefix, Format format, std::ostream& out);

  StepReport(const StepReport&) = delete;
  StepReport& operator=(const StepReport&) = delete;

  void Add(const v1::Session& session);

  // Writes the rest of the table or of the JSON document to `out`. Call it once,
  // after the last Add().
  void Finish();

 private:
  void AddJson(const v1::Session& session);

  const std::string prefix_;
  const Format format_;
  std::ostream& out_;
  int64_t sessions_ = 0;
  int64_t stepped_ = 0;
  int64_t with_incomplete_ = 0;
  std::optional<int64_t> min_applied_;
  std::optional<int64_t> max_applied_;
  std::set<int32_t> missing_;                   // ranks steps were closed without
  std::set<int32_t> waiting_;                   // ranks open steps wait for
  std::vector<std::vector<std::string>> rows_;  // table cells
};

}  // namespace qparams::report

#endif  // QPARAMS_TOOLS_STEP_REPORT_H_
