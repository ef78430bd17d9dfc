// The coverage report's page (report.h CoverageReport::AddPlot, WriteHtml): one
// self-contained HTML document, each initialized session's section an inline SVG of its
// ranges and scales, or of its histogram of |x| with the chosen amax. The table and
// JSON are report.cc's.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/report.h"
#include "tools/report_text.h"

namespace qparams::report {
namespace {

using google::protobuf::RepeatedField;
using internal::Float;
using internal::Ratio;

// Names are [a-zA-Z0-9._/-] on the server, but the page does not rely on it.
std::string Html(absl::string_view text) {
  std::string escaped;
  for (const char c : text) {
    switch (c) {
      case '&':
        escaped += "&amp;";
        break;
      case '<':
        escaped += "&lt;";
        break;
      case '>':
        escaped += "&gt;";
        break;
      case '"':
        escaped += "&quot;";
        break;
      case '\'':
        escaped += "&#39;";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

bool HasRunningRange(const v1::Session& session) {
  return session.running_min_size() > 0 &&
         session.running_min_size() == session.qparams().scale_size() &&
         session.running_max_size() == session.running_min_size();
}

// ---------------------------------------------------------------- plots

// The geometry of a plot, in SVG user units.
constexpr double kPlotWidth = 720;
constexpr double kLeft = 76;  // the y labels
constexpr double kRight = 12;
constexpr double kPanelTitle = 18;
constexpr double kPanelHeight = 96;
constexpr double kPanelGap = 8;
constexpr double kCaption = 34;   // the x labels and the caption under the last panel
constexpr int64_t kMaxDots = 16;  // fewer positions than this also get a dot each

// Per drawn position: the least and the greatest finite value of the run of adjacent
// positions it stands for; NaN if the run has none.
struct Envelope {
  std::vector<double> lo;
  std::vector<double> hi;
};

int64_t PointCount(int64_t positions) { return std::min<int64_t>(positions, kMaxPlotPoints); }

Envelope EnvelopeOf(const RepeatedField<float>& values) {
  const int64_t n = values.size();
  const int64_t points = PointCount(n);
  Envelope envelope;
  envelope.lo.assign(points, std::numeric_limits<double>::quiet_NaN());
  envelope.hi.assign(points, std::numeric_limits<double>::quiet_NaN());
  for (int64_t p = 0; p < points; ++p) {
    for (int64_t i = p * n / points; i < (p + 1) * n / points; ++i) {
      const double v = values[i];
      if (!std::isfinite(v)) continue;
      // fmin/fmax ignore the NaN a run starts with.
      envelope.lo[p] = std::fmin(envelope.lo[p], v);
      envelope.hi[p] = std::fmax(envelope.hi[p], v);
    }
  }
  return envelope;
}

// The y axis of a panel: from the least of `lo` to the greatest of `hi` (finite values),
// widened to hold `floor` (0 for both panels).
std::pair<double, double> Domain(const std::vector<double>& lo, const std::vector<double>& hi,
                                 double floor) {
  double min = floor, max = floor;
  for (const double v : lo) min = std::fmin(min, v);
  for (const double v : hi) max = std::fmax(max, v);
  if (max == min) max = min + 1;  // a flat plot still has an axis
  return {min, max};
}

std::string Label(double value) { return absl::StrFormat("%.4g", value); }

// Draws a panel's title at `top` and its frame, `height` high, under it.
void Frame(std::string& svg, absl::string_view title, double top, double height) {
  absl::StrAppendFormat(&svg, "<text x=\"%g\" y=\"%g\" class=\"title\">%s</text>\n", kLeft,
                        top + 13, title);
  absl::StrAppendFormat(&svg,
                        "<rect class=\"frame\" x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\"/>\n",
                        kLeft, top + kPanelTitle, kPlotWidth - kLeft - kRight, height);
}

// One panel of a plot: where its y axis maps values, drawn into `svg` as it is built.
class Panel {
 public:
  // Draws the panel's title, frame and y labels (and a zero line inside it) at `top`.
  Panel(std::string& svg, absl::string_view title, double top, int64_t points, double min,
        double max)
      : svg_(svg), top_(top + kPanelTitle), points_(points), min_(min), max_(max) {
    Frame(svg_, title, top, kPanelHeight);
    absl::StrAppendFormat(&svg_, "<text x=\"%g\" y=\"%.1f\" class=\"y\">%s</text>\n", kLeft - 4,
                          top_ + 4, Label(max));
    absl::StrAppendFormat(&svg_, "<text x=\"%g\" y=\"%.1f\" class=\"y\">%s</text>\n", kLeft - 4,
                          top_ + kPanelHeight, Label(min));
    if (min < 0 && max > 0) {
      absl::StrAppendFormat(&svg_,
                            "<line class=\"zero\" x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\"/>\n"
                            "<text x=\"%g\" y=\"%.1f\" class=\"y\">0</text>\n",
                            kLeft, Y(0), kPlotWidth - kRight, Y(0), kLeft - 4, Y(0) + 4);
    }
  }

  // A line through `values` (non-finite ones left out).
  void Line(const std::vector<double>& values, absl::string_view css_class) {
    absl::StrAppendFormat(&svg_, "<polyline class=\"%s\" points=\"%s\"/>\n", css_class,
                          Points(values, false));
    Dots(values, css_class);
  }

  // The area from `lo` up to `hi`.
  void Band(const std::vector<double>& lo, const std::vector<double>& hi,
            absl::string_view css_class) {
    absl::StrAppendFormat(&svg_, "<polygon class=\"%s\" points=\"%s %s\"/>\n", css_class,
                          Points(hi, false), Points(lo, true));
    Dots(lo, css_class);
    Dots(hi, css_class);
  }

 private:
  double X(int64_t point) const {
    const double width = kPlotWidth - kLeft - kRight;
    if (points_ == 1) return kLeft + width / 2;
    return kLeft + width * static_cast<double>(point) / static_cast<double>(points_ - 1);
  }
  double Y(double value) const { return top_ + kPanelHeight * (max_ - value) / (max_ - min_); }

  std::string Points(const std::vector<double>& values, bool reversed) const {
    std::string points;
    for (size_t k = 0; k < values.size(); ++k) {
      const size_t p = reversed ? values.size() - 1 - k : k;
      if (!std::isfinite(values[p])) continue;
      absl::StrAppendFormat(&points, "%s%.1f,%.1f", points.empty() ? "" : " ",
                            X(static_cast<int64_t>(p)), Y(values[p]));
    }
    return points;
  }

  // A dot per position when there are few, so that one channel (per tensor) shows.
  void Dots(const std::vector<double>& values, absl::string_view css_class) {
    if (static_cast<int64_t>(values.size()) >= kMaxDots) return;
    for (size_t p = 0; p < values.size(); ++p) {
      if (!std::isfinite(values[p])) continue;
      absl::StrAppendFormat(&svg_, "<circle class=\"%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\"/>\n",
                            css_class, X(static_cast<int64_t>(p)), Y(values[p]));
    }
  }

  std::string& svg_;
  const double top_;
  const int64_t points_;
  const double min_;
  const double max_;
};

// What the x axis counts, after the session's granularity.
std::string PositionName(const v1::Granularity& granularity) {
  switch (granularity.kind_case()) {
    case v1::Granularity::kPerChannel:
      return absl::StrCat("channel (axis ", granularity.per_channel().axis(), ")");
    case v1::Granularity::kPerBlock:
      return "block (row-major)";
    default:
      return "tensor";
  }
}

// The inline SVG of one initialized session: its running range (when its calculator
// keeps one) and its scales, per channel or block.
std::string PlotSvg(const v1::Session& session) {
  const int64_t n = session.qparams().scale_size();
  const int64_t points = PointCount(n);
  const bool running = HasRunningRange(session);
  const int panels = running ? 2 : 1;
  const double height = panels * (kPanelTitle + kPanelHeight + kPanelGap) + kCaption;

  std::string svg = absl::StrFormat(
      "<svg class=\"plot\" viewBox=\"0 0 %g %g\" width=\"%g\" height=\"%g\" role=\"img\" "
      "aria-label=\"%s\">\n",
      kPlotWidth, height, kPlotWidth, height,
      Html(absl::StrCat(session.name(), running ? ": running range and scale" : ": scale")));
  double top = 0;
  if (running && points > 0) {
    const Envelope min = EnvelopeOf(session.running_min());
    const Envelope max = EnvelopeOf(session.running_max());
    const auto [lo, hi] = Domain(min.lo, max.hi, 0);
    Panel panel(svg, "running range: running_min to running_max", top, points, lo, hi);
    panel.Band(min.lo, max.hi, "range");
    top += kPanelTitle + kPanelHeight + kPanelGap;
  }
  if (points > 0) {
    const Envelope scale = EnvelopeOf(session.qparams().scale());
    const auto [lo, hi] = Domain(scale.lo, scale.hi, 0);
    Panel panel(svg, "scale", top, points, lo, hi);
    if (points < n) {
      panel.Band(scale.lo, scale.hi, "scale-band");
    } else {
      panel.Line(scale.hi, "scale");
    }
    top += kPanelTitle + kPanelHeight + kPanelGap;
  }

  const std::string shape = absl::StrJoin(session.qparams().shape(), ", ");
  std::string caption = n == 0 ? "no scales"
                               : absl::StrCat(PositionName(session.spec().granularity()), " 0 to ",
                                              n - 1, " of ", n, ", shape [", shape, "]");
  if (points < n) {
    absl::StrAppend(&caption, "; each point: up to ", (n + points - 1) / points,
                    " adjacent, least to greatest");
  }
  if (n > 0) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%g\" y=\"%g\" class=\"x\">0</text>\n"
                          "<text x=\"%g\" y=\"%g\" class=\"x end\">%d</text>\n",
                          kLeft, top + 4, kPlotWidth - kRight, top + 4, n - 1);
  }
  absl::StrAppendFormat(&svg, "<text x=\"%g\" y=\"%g\" class=\"caption\">%s</text>\n</svg>\n",
                        kLeft, top + 22, Html(caption));
  return svg;
}

// ---------------------------------------------------------------- histograms

constexpr double kHistogramHeight = 160;
constexpr int kMaxDecadeLabels = 6;  // on a histogram's y axis

// A histogram's bins summed into at most kMaxHistogramColumns columns of
// `bins_per_column` adjacent bins each (the last one possibly shorter).
struct Columns {
  int64_t bins_per_column = 1;
  std::vector<uint64_t> counts;
};

Columns ColumnsOf(const RepeatedField<uint64_t>& counts) {
  const int64_t bins = counts.size();
  Columns columns;
  columns.bins_per_column =
      std::max<int64_t>(1, (bins + kMaxHistogramColumns - 1) / kMaxHistogramColumns);
  columns.counts.assign((bins + columns.bins_per_column - 1) / columns.bins_per_column, 0);
  // No overflow: a session holds fewer than 2^62 values (histogram.md 2.1).
  for (int64_t k = 0; k < bins; ++k) columns.counts[k / columns.bins_per_column] += counts[k];
  return columns;
}

// max(|min|, |max|) of `histogram`; unset before its first finite value.
std::optional<double> MaxAbs(const v1::HistogramObservation& histogram) {
  if (!histogram.has_min() || !histogram.has_max()) return std::nullopt;
  return std::max(std::abs(histogram.min()), std::abs(histogram.max()));
}

uint64_t Total(const v1::HistogramObservation& histogram) {
  uint64_t total = 0;
  for (const uint64_t c : histogram.counts()) total += c;
  return total;
}

// The inline SVG of a histogram session: its histogram of |x|, y = log10(count + 1) so
// that an empty bin sits at zero and a single value shows, x = |x| on a linear scale
// from 0 to the upper edge of the last occupied bin; the calibration's amax and max |x|
// marked with their values.
std::string HistogramSvg(const v1::Session& session, const v1::HistogramObservation& histogram) {
  const double bin_width = std::ldexp(1.0, histogram.exponent());
  const int64_t bins = histogram.counts_size();
  const Columns columns = ColumnsOf(histogram.counts());
  const bool has_amax = session.has_calibration();
  const double amax = session.calibration().amax();
  const std::optional<double> max_abs = MaxAbs(histogram);
  // Widened to both markers, should a marker lie beyond the bins it was read with.
  double x_max = static_cast<double>(bins) * bin_width;
  if (has_amax) x_max = std::fmax(x_max, amax);
  if (max_abs.has_value()) x_max = std::fmax(x_max, *max_abs);
  if (!(x_max > 0)) x_max = 1;  // no finite value: an axis all the same
  uint64_t peak = 0;
  for (const uint64_t c : columns.counts) peak = std::max(peak, c);
  // At least 1 (a count of 9), so that a near-empty histogram is not drawn full height.
  const double y_max = std::fmax(1, std::log10(static_cast<double>(peak) + 1));

  const double top = kPanelTitle;
  const double width = kPlotWidth - kLeft - kRight;
  const auto x = [&](double v) { return kLeft + width * v / x_max; };
  const auto y = [&](double count) {
    return top + kHistogramHeight * (1 - std::log10(count + 1) / y_max);
  };
  const double height = kPanelTitle + kHistogramHeight + kPanelGap + kCaption;
  std::string svg = absl::StrFormat(
      "<svg class=\"plot\" viewBox=\"0 0 %g %g\" width=\"%g\" height=\"%g\" role=\"img\" "
      "aria-label=\"%s\">\n",
      kPlotWidth, height, kPlotWidth, height,
      Html(absl::StrCat(session.name(), ": histogram of |x|")));
  Frame(svg, "histogram of |x|: count, log scale", 0, kHistogramHeight);

  // The y axis: 0, then counts 1, 10, 100, ... (every few decades when there are many).
  absl::StrAppendFormat(&svg, "<text x=\"%g\" y=\"%.1f\" class=\"y\">0</text>\n", kLeft - 4, y(0));
  const int decades = peak == 0 ? 0 : static_cast<int>(std::floor(std::log10(peak))) + 1;
  const int step = (decades + kMaxDecadeLabels - 1) / kMaxDecadeLabels;
  for (int d = 0; step > 0 && d < decades; d += step) {
    const double at = y(std::pow(10.0, d));
    absl::StrAppendFormat(&svg,
                          "<line class=\"grid\" x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\"/>\n"
                          "<text x=\"%g\" y=\"%.1f\" class=\"y\">%g</text>\n",
                          kLeft, at, kPlotWidth - kRight, at, kLeft - 4, at + 4, std::pow(10.0, d));
  }

  // One outline of steps, a column at a time; an empty column runs along zero.
  if (!columns.counts.empty()) {
    std::string d = absl::StrFormat("M%.1f,%.1f", x(0), y(0));
    for (size_t c = 0; c < columns.counts.size(); ++c) {
      const int64_t end =
          std::min<int64_t>(static_cast<int64_t>(c + 1) * columns.bins_per_column, bins);
      absl::StrAppendFormat(&d, " V%.1f H%.1f", y(static_cast<double>(columns.counts[c])),
                            x(static_cast<double>(end) * bin_width));
    }
    absl::StrAppendFormat(&d, " V%.1f Z", y(0));
    absl::StrAppendFormat(&svg, "<path class=\"hist\" d=\"%s\"/>\n", d);
  }

  // The markers, each labelled on a row of its own, on the side with more room.
  int row = 0;
  const auto marker = [&](double value, absl::string_view css_class, const std::string& text) {
    const double at = x(value);
    const bool left = at > kLeft + width / 2;
    absl::StrAppendFormat(&svg,
                          "<line class=\"%s\" x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\"/>\n"
                          "<text x=\"%.1f\" y=\"%g\" class=\"%s%s\">%s</text>\n",
                          css_class, at, top, at, top + kHistogramHeight, left ? at - 4 : at + 4,
                          top + 14 + 14 * row, css_class, left ? " end" : "", Html(text));
    ++row;
  };
  if (has_amax) {
    marker(amax, "amax", absl::StrCat("amax (", session.calculator(), ") = ", Label(amax)));
  }
  if (max_abs.has_value()) {
    marker(*max_abs, "max-abs", absl::StrCat("max |x| = ", Label(*max_abs)));
  }

  const double bottom = top + kHistogramHeight + kPanelGap;
  std::string caption;
  if (bins == 0) {
    caption = "no finite value observed";
  } else {
    caption = absl::StrCat("|x|: ", bins, " occupied bins of 2^", histogram.exponent(), " (",
                           Float(bin_width), ")");
    if (columns.bins_per_column > 1) {
      absl::StrAppend(&caption, "; each column: ", columns.bins_per_column,
                      " adjacent bins summed");
    }
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%g\" y=\"%g\" class=\"x\">0</text>\n"
                        "<text x=\"%g\" y=\"%g\" class=\"x end\">%s</text>\n"
                        "<text x=\"%g\" y=\"%g\" class=\"caption\">%s</text>\n</svg>\n",
                        kLeft, bottom + 4, kPlotWidth - kRight, bottom + 4, Label(x_max), kLeft,
                        bottom + 22, Html(caption));
  return svg;
}

// WriteHtml() copies the plots into the page this many bytes at a time.
constexpr int64_t kCopyChunk = 64 << 10;

constexpr absl::string_view kStyle = R"(
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 24px; max-width: 780px; }
h1 { font-size: 22px; margin: 0 0 8px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ccc; }
h3 { font: 600 14px monospace; margin: 0; }
code { font-family: monospace; }
.note, .legend { color: #555; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { text-align: left; padding: 2px 10px 2px 0; border-bottom: 1px solid #e4e4e4; }
td.name { font-family: monospace; }
.session { margin: 16px 0 24px; }
.meta { margin: 2px 0 6px; color: #555; font-size: 12px; }
svg.plot { display: block; width: 100%; max-width: 720px; height: auto; }
svg text { font: 11px sans-serif; fill: #444; }
svg text.y { text-anchor: end; }
svg text.end { text-anchor: end; }
svg text.title { font-weight: 600; }
.frame { fill: #fafafa; stroke: #bbb; }
.zero { stroke: #999; stroke-dasharray: 3 3; }
polygon.range { fill: #c6dbef; stroke: #2166ac; stroke-width: 1; }
polyline.scale { fill: none; stroke: #1b7837; stroke-width: 1.5; }
polygon.scale-band { fill: #c7e9c0; stroke: #1b7837; stroke-width: 1; }
circle.range { fill: #2166ac; }
circle.scale, circle.scale-band { fill: #1b7837; }
.grid { stroke: #e4e4e4; }
path.hist { fill: #c6dbef; stroke: #2166ac; stroke-width: 1; }
line.amax { stroke: #b2182b; stroke-width: 1.5; }
line.max-abs { stroke: #555; stroke-width: 1.5; stroke-dasharray: 4 3; }
svg text.amax { fill: #b2182b; }
)";

}  // namespace

void CoverageReport::AddPlot(const v1::Session& session, const v1::HistogramObservation* histogram,
                             const std::optional<ScaleSpread>& spread, int64_t non_finite) {
  std::string meta = absl::StrCat(Html(session.calculator()), " &middot; ",
                                  Html(SpecSummary(session.spec())), " &middot; ", "observations ",
                                  session.observation_count(), " &middot; non_finite ", non_finite);
  if (spread.has_value()) {
    absl::StrAppend(&meta, "<br>scales: count ", spread->count, ", min ", Float(spread->min),
                    ", median ", Float(spread->median), ", max ", Float(spread->max), ", max/min ",
                    Ratio(*spread));
    if (spread->nan > 0) absl::StrAppend(&meta, ", NaN ", spread->nan, " (left out)");
  }
  if (session.has_calibration()) {
    const v1::CalibrationResult& c = session.calibration();
    absl::StrAppend(&meta, "<br>calibration: amax ", Float(c.amax()), ", bin_index ", c.bin_index(),
                    ", exponent ", c.exponent(), ", total_count ", c.total_count());
    if (c.has_kl_margin()) absl::StrAppend(&meta, ", kl_margin ", Float(c.kl_margin()));
  }
  if (histogram != nullptr) {
    const uint64_t total = Total(*histogram);
    absl::StrAppend(&meta, "<br>histogram: num_bins ", histogram->num_bins(), ", ",
                    histogram->counts_size(), " occupied, ", total, " finite values (zeros ",
                    histogram->zero_count(), ", negative ", histogram->negative_count(), "), NaN ",
                    histogram->nan_count(), ", +inf ", histogram->posinf_count(), ", -inf ",
                    histogram->neginf_count());
    // GetHistogram runs after ReadSessions read the session: observations in between
    // show here, beside a calibration of fewer values.
    if (session.has_calibration() && total != session.calibration().total_count()) {
      absl::StrAppend(&meta, "<br>the histogram was read after the calibration and holds ", total,
                      " finite values against its ", session.calibration().total_count());
    }
  } else if (session.has_histogram()) {
    absl::StrAppend(&meta, "<br>no histogram: it could not be read, so the scale is plotted");
  }
  if (histogram == nullptr && !HasRunningRange(session)) {
    absl::StrAppend(&meta, "<br>no running range: this calculator keeps none");
  }
  const std::string svg =
      histogram != nullptr ? HistogramSvg(session, *histogram) : PlotSvg(session);
  const std::string section =
      absl::StrCat("<section class=\"session\">\n<h3>", Html(session.name()),
                   "</h3>\n<p class=\"meta\">", meta, "</p>\n", svg, "</section>\n");
  plots_->write(section.data(), static_cast<std::streamsize>(section.size()));
  plot_bytes_ += static_cast<int64_t>(section.size());
}

absl::Status CoverageReport::WriteHtml(std::ostream& page) {
  const int64_t initialized = sessions_ - static_cast<int64_t>(uninitialized_.size());
  page << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          // Nothing to fetch and nothing to run: the page is one file, safe offline.
          "<meta http-equiv=\"Content-Security-Policy\" "
          "content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
       << "<title>qparams coverage report: " << Html(prefix_) << "</title>\n<style>" << kStyle
       << "</style>\n</head>\n<body>\n<h1>qparams coverage report</h1>\n"
       << "<p class=\"summary\">Prefix <code>" << Html(prefix_) << "</code>: " << sessions_
       << " sessions, " << initialized << " initialized, " << uninitialized_.size()
       << " uninitialized.</p>\n"
       << "<p class=\"legend\">Each plot shows, per channel or per block (row-major), the "
          "running range (blue band, running_min to running_max) when the calculator keeps one, "
          "and the scale (green). A plot draws at most "
       << kMaxPlotPoints
       << " points; beyond, each point stands for adjacent channels or blocks and is drawn from "
          "their least to their greatest value. A percentile, entropy or mse session shows its "
          "histogram of |x| instead: log10(count + 1) over |x|, at most "
       << kMaxHistogramColumns
       << " columns (beyond, each sums adjacent bins), with the calibration's amax (red) and "
          "max |x| = max(|min|, |max|) (dashed) marked.</p>\n"
       << "<p class=\"note\">" << Html(kNonFiniteNote) << ".</p>\n";

  page << "<section id=\"uninitialized\">\n<h2>Uninitialized sessions (" << uninitialized_.size()
       << ")</h2>\n";
  if (uninitialized_.empty()) {
    page << "<p>None: every session has computed qparams.</p>\n";
  } else {
    page << "<p>These sessions have not computed a forward yet: no qparams, no plot.</p>\n"
         << "<table>\n<tr><th>name</th><th>calculator</th><th>spec</th>"
            "<th>observations</th></tr>\n";
    for (const Uninitialized& u : uninitialized_) {
      page << "<tr><td class=\"name\">" << Html(u.name) << "</td><td>" << Html(u.calculator)
           << "</td><td>" << Html(u.spec) << "</td><td>" << u.observations << "</td></tr>\n";
    }
    page << "</table>\n";
  }
  page << "</section>\n<section id=\"initialized\">\n<h2>Initialized sessions (" << initialized
       << ")</h2>\n";

  // The plots, in the order added, a chunk at a time.
  plots_->flush();
  const bool written = static_cast<bool>(*plots_);
  plots_->seekg(0);
  int64_t copied = 0;
  std::vector<char> chunk(kCopyChunk);
  while (written && *plots_ && copied < plot_bytes_) {
    plots_->read(chunk.data(),
                 static_cast<std::streamsize>(std::min<int64_t>(kCopyChunk, plot_bytes_ - copied)));
    page.write(chunk.data(), plots_->gcount());
    copied += plots_->gcount();
  }
  page << "</section>\n</body>\n</html>\n";
  if (!written) return absl::DataLossError("writing the plots failed");
  if (copied != plot_bytes_) {
    return absl::DataLossError(
        absl::StrCat("reading the plots back gave ", copied, " of ", plot_bytes_, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace qparams::report
