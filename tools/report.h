// The coverage report of a calibration run (`qparams-cli report`): the sessions under a
// prefix, rendered as they stream in from ReadSessions, as a table or one JSON
// document, and optionally as one self-contained HTML page with a plot of each
// initialized session's per-channel (or per-block) ranges and scales, or of a
// histogram session's histogram of |x| with its chosen amax.
//
// Target qparams_report (tools/README.md): a tool, rendering Session messages it
// is given; it depends on the wire messages only, never on the RPC client.

#ifndef QPARAMS_TOOLS_REPORT_H_
#define QPARAMS_TOOLS_REPORT_H_

#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams::report {

// How the rows go to the report's output stream.
enum class Format { kJson, kTable };

// A plot draws at most this many positions (channels or blocks). Beyond it, each
// position stands for a run of adjacent ones and draws their envelope (the least
// minimum and the greatest maximum), so that a page of large sessions stays small.
inline constexpr int kMaxPlotPoints = 512;

// A histogram plot draws at most this many columns. Beyond it, each column sums a run of
// adjacent bins (of equal length), so that 65536 bins still draw as a small page.
inline constexpr int kMaxHistogramColumns = 256;

// What the report says about non_finite, in every format. The count is honest rather
// than assumed: finite data can still overflow (a range wider than float32's largest
// value gives an infinite scale).
inline constexpr absl::string_view kNonFiniteNote =
    "non_finite counts the NaN and infinite values among a session's scales, minvals and "
    "running ranges: the server refuses non-finite inputs (INVALID_ARGUMENT), so a session "
    "never holds one from its data, and a count above 0 would come from the computation "
    "itself";

// Rows of cells in aligned columns two spaces apart, the first row being the header,
// as the other commands' tables (the coverage report's, the step report's).
void PrintColumns(const std::vector<std::vector<std::string>>& rows, std::ostream& out);

// The spread of a session's scales. An infinite scale is a value of the spread (inf),
// never left out: a summary of the finite ones alone would hide it, and one of 0s would
// be false. NaN has no order, so it is counted apart.
struct ScaleSpread {
  int64_t count = 0;  // scales, finite or not
  int64_t nan = 0;    // NaN scales: left out of min, median and max
  // Over the scales that are not NaN, infinities included; unset when every scale is NaN.
  std::optional<float> min;
  std::optional<float> median;  // the lower middle value for an even count, so one of the scales
  std::optional<float> max;
  std::optional<double> max_over_min;  // unset when min is unset, 0 or infinite
};

// The spread of `session`'s scales; unset for a session without any (uninitialized).
std::optional<ScaleSpread> SpreadOf(const v1::Session& session);

// The NaN and infinite values among `session`'s scales, minvals, running_min and
// running_max.
int64_t NonFiniteCount(const v1::Session& session);

// `spec` in one short line, its granularity in the CLI's syntax:
// "int8 asymmetric per_channel:0 weight", plus " scale_dtype=..." and
// " float_range=[MIN, MAX]" (an unset bound is "observed") when set.
std::string SpecSummary(const v1::QuantSpec& spec);

// Renders the report of the sessions Add() is given, in the order given (ReadSessions
// gives name order), uninitialized sessions first in the table and at the top of the
// page. JSON goes to `out` as each session is added (the uninitialized names at the
// end); the table at Finish(), as its columns are aligned over every row; with a page,
// each initialized session's plot goes to the caller's `plots` sink as it is added, and
// WriteHtml() copies them into the page after the uninitialized section. Memory: one
// short row per session for the table, the uninitialized sessions (name, calculator,
// spec summary), and one plot (at most kMaxPlotPoints positions or kMaxHistogramColumns
// columns) at a time; never the page, however many sessions.
//
// Not thread-safe: one thread adds the sessions of one stream, then calls Finish().
class CoverageReport {
 public:
  // `prefix` is the prefix the sessions were read under, shown in the report. With
  // JSON, writes the start of the document to `out` now. `plots`: for a page, an empty
  // stream (a temporary file, say) that Add() writes the plots to and WriteHtml() reads
  // back from its start; it must outlive the report. nullptr: no page.
  CoverageReport(std::string prefix, Format format, std::iostream* plots, std::ostream& out);

  CoverageReport(const CoverageReport&) = delete;
  CoverageReport& operator=(const CoverageReport&) = delete;

  // Adds one session to the report. `histogram`: for the page, the histogram of an
  // initialized histogram session (Session.histogram set: percentile, entropy, mse) as
  // GetHistogram gives it; its plot is then that histogram of |x| on a log scale with
  // the calibration's amax and max |x| marked, in place of the scale. nullptr for any
  // other session, and for a histogram session whose histogram could not be read (its
  // page section then says so and plots its scale). The table and JSON ignore it.
  void Add(const v1::Session& session, const v1::HistogramObservation* histogram = nullptr);

  // Writes the rest of the table or of the JSON document to `out`. Call it once,
  // after the last Add().
  void Finish();

  // Writes the page to `page`: one HTML document with inline CSS and inline SVG, no
  // script and nothing to fetch (its Content-Security-Policy forbids it); the
  // uninitialized sessions listed first, then one `<svg class="plot">` per
  // initialized session, copied from `plots` in chunks. Requires `plots` at
  // construction; call it once, after Finish(). DATA_LOSS when `plots` failed to take
  // or give back every plot; `page`'s own state tells whether writing it failed.
  absl::Status WriteHtml(std::ostream& page);

 private:
  // A session without qparams: listed, not plotted.
  struct Uninitialized {
    std::string name;
    std::string calculator;
    std::string spec;
    int64_t observations;
    int64_t non_finite;
  };

  void AddJson(const v1::Session& session, const std::optional<ScaleSpread>& spread,
               int64_t non_finite);
  // The spec in protobuf's JSON mapping. Cached by its bytes: the sessions of a run
  // share a few specs, and protobuf's JSON printer costs more than the rest of a row.
  const std::string& SpecJsonOf(const v1::QuantSpec& spec);
  void AddPlot(const v1::Session& session, const v1::HistogramObservation* histogram,
               const std::optional<ScaleSpread>& spread, int64_t non_finite);

  const std::string prefix_;
  const Format format_;
  std::iostream* const plots_;  // the page's plot sections, as they are added
  std::ostream& out_;
  int64_t sessions_ = 0;
  std::vector<Uninitialized> uninitialized_;
  std::vector<std::vector<std::string>> initialized_rows_;  // table cells
  int64_t plot_bytes_ = 0;                                  // written to plots_
  static constexpr size_t kSpecJsonCacheSize = 256;
  std::unordered_map<std::string, std::string> spec_json_;  // serialized spec -> its JSON
};

}  // namespace qparams::report

#endif  // QPARAMS_TOOLS_REPORT_H_
