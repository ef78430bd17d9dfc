// The coverage report (tools/report.h) on hand-built sessions: the table, the JSON
// document parsed back, the HTML page's plots, order and escaping, the spread and
// non-finite counts, downsampling, many sessions; and `qparams-cli report` (cli::Run)
// against an in-process server, --html files included.

#include "tools/report.h"

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "qparams/client.h"
#include "qparams/v1/qparams.pb.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"
#include "tools/cli.h"

namespace qparams::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using report::CoverageReport;
using report::Format;

// A session as ReadSessions gives it: initialized when it has scales.
v1::Session MakeSession(const std::string& name, const std::string& calculator,
                        const std::string& granularity, const std::vector<float>& scales,
                        const std::vector<float>& running_min = {},
                        const std::vector<float>& running_max = {}) {
  v1::Session s;
  s.set_name(name);
  s.set_calculator(calculator);
  s.mutable_spec()->set_dtype("int8");
  s.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  v1::Granularity* g = s.mutable_spec()->mutable_granularity();
  if (granularity == "per_channel:0") {
    g->mutable_per_channel()->set_axis(0);
  } else if (granularity == "per_block:1:32") {
    g->mutable_per_block()->set_axis(1);
    g->mutable_per_block()->add_block_size(32);
  } else {
    g->mutable_per_tensor();
  }
  s.set_initialized(!scales.empty());
  s.set_observation_count(scales.empty() ? 0 : 3);
  if (!scales.empty()) {
    s.mutable_qparams()->add_shape(static_cast<int64_t>(scales.size()));
    s.mutable_qparams()->add_shape(1);
  }
  for (const float v : scales) {
    s.mutable_qparams()->add_scale(v);
    s.mutable_qparams()->add_zero_point(0);
    s.mutable_qparams()->add_minval(-v * 128);
  }
  for (const float v : running_min) s.add_running_min(v);
  for (const float v : running_max) s.add_running_max(v);
  return s;
}

// Three sessions in name order: a running one, an uninitialized one, a static one.
std::vector<v1::Session> ThreeSessions() {
  return {MakeSession("run/a", "global_minmax", "per_channel:0", {0.5f, 1, 2, 4},
                      {-64, -128, -256, -512}, {63.5f, 127, 254, 508}),
          MakeSession("run/b", "moving_average", "per_tensor", {}),
          MakeSession("run/c", "static", "per_block:1:32", {0.25f, 0.125f})};
}

std::string Render(const std::vector<v1::Session>& sessions, Format format,
                   std::string* page = nullptr) {
  std::ostringstream out;
  std::stringstream plots;
  CoverageReport report("run/", format, page != nullptr ? &plots : nullptr, out);
  for (const v1::Session& s : sessions) report.Add(s);
  report.Finish();
  if (page != nullptr) {
    std::ostringstream html;
    EXPECT_TRUE(report.WriteHtml(html).ok());
    *page = html.str();
  }
  return out.str();
}

Struct ParseJson(const std::string& json) {
  Struct doc;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &doc);
  EXPECT_TRUE(status.ok()) << status.ToString() << " in\n" << json;
  return doc;
}

size_t Count(absl::string_view text, absl::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != absl::string_view::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

TEST(CoverageReport, TableListsUninitializedFirstWithTheSpread) {
  const std::string out = Render(ThreeSessions(), Format::kTable);
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << out;
  EXPECT_TRUE(absl::StartsWith(lines[0], "NAME   CALCULATOR      SPEC")) << out;
  EXPECT_TRUE(absl::StrContains(lines[0], "NON_FINITE  SCALES  SCALE_MIN")) << out;
  EXPECT_TRUE(
      absl::StartsWith(lines[1], "run/b  moving_average  int8 asymmetric per_tensor weight"))
      << out;
  EXPECT_TRUE(absl::StrContains(lines[1], "false")) << out;
  EXPECT_TRUE(absl::StartsWith(lines[2], "run/a  global_minmax   int8 asymmetric per_channel:0"))
      << out;
  // 4 scales: min 0.5, lower median 1, max 4, max/min 8.
  const std::vector<absl::string_view> a = absl::StrSplit(lines[2], ' ', absl::SkipEmpty());
  ASSERT_EQ(a.size(), 14u) << lines[2];
  EXPECT_EQ(std::vector<absl::string_view>(a.begin() + 6, a.end()),
            (std::vector<absl::string_view>{"3", "true", "0", "4", "0.5", "1", "4", "8"}));
  EXPECT_TRUE(absl::StartsWith(lines[3], "run/c  static")) << out;
  EXPECT_TRUE(absl::StrContains(lines[3], "per_block:1:32")) << out;
  EXPECT_EQ(lines[4], "3 sessions under prefix \"run/\": 2 initialized, 1 uninitialized");
  EXPECT_TRUE(absl::StartsWith(lines[5], "non_finite counts the NaN")) << out;
}

TEST(CoverageReport, JsonIsOneDocument) {
  const Struct doc = ParseJson(Render(ThreeSessions(), Format::kJson));
  const auto& f = doc.fields();
  EXPECT_EQ(f.at("prefix").string_value(), "run/");
  EXPECT_TRUE(absl::StrContains(f.at("note").string_value(), "refuses non-finite inputs"));
  EXPECT_EQ(f.at("session_count").number_value(), 3);
  EXPECT_EQ(f.at("initialized_count").number_value(), 2);
  ASSERT_EQ(f.at("uninitialized").list_value().values_size(), 1);
  EXPECT_EQ(f.at("uninitialized").list_value().values(0).string_value(), "run/b");

  const auto& sessions = f.at("sessions").list_value().values();
  ASSERT_EQ(sessions.size(), 3);  // in the order given
  const auto& a = sessions[0].struct_value().fields();
  EXPECT_EQ(a.at("name").string_value(), "run/a");
  EXPECT_EQ(a.at("calculator").string_value(), "global_minmax");
  EXPECT_EQ(a.at("spec").struct_value().fields().at("qscheme").string_value(), "ASYMMETRIC");
  EXPECT_EQ(a.at("spec_summary").string_value(), "int8 asymmetric per_channel:0 weight");
  EXPECT_TRUE(a.at("initialized").bool_value());
  EXPECT_EQ(a.at("observation_count").number_value(), 3);
  EXPECT_EQ(a.at("non_finite").number_value(), 0);
  ASSERT_EQ(a.at("shape").list_value().values_size(), 2);
  EXPECT_EQ(a.at("shape").list_value().values(0).number_value(), 4);
  const auto& scales = a.at("scales").struct_value().fields();
  EXPECT_EQ(scales.at("count").number_value(), 4);
  EXPECT_EQ(scales.at("min").number_value(), 0.5);
  EXPECT_EQ(scales.at("median").number_value(), 1);
  EXPECT_EQ(scales.at("max").number_value(), 4);
  EXPECT_EQ(scales.at("max_over_min").number_value(), 8);

  // Each session's own spec (the JSON of specs is cached by their bytes).
  EXPECT_EQ(sessions[2]
                .struct_value()
                .fields()
                .at("spec")
                .struct_value()
                .fields()
                .at("granularity")
                .struct_value()
                .fields()
                .count("per_block"),
            1u);
  const auto& b = sessions[1].struct_value().fields();
  EXPECT_FALSE(b.at("initialized").bool_value());
  EXPECT_EQ(b.at("scales").kind_case(), Value::kNullValue);
  EXPECT_EQ(b.at("non_finite").number_value(), 0);
}

TEST(CoverageReport, EmptyReportIsStillOneDocument) {
  const Struct doc = ParseJson(Render({}, Format::kJson));
  EXPECT_EQ(doc.fields().at("sessions").list_value().values_size(), 0);
  EXPECT_EQ(doc.fields().at("session_count").number_value(), 0);
  std::string page;
  Render({}, Format::kTable, &page);
  EXPECT_EQ(Count(page, "<svg class=\"plot\""), 0u);
  EXPECT_TRUE(absl::StrContains(page, "None: every session has computed qparams."));
}

TEST(CoverageReport, FloatsRoundTrip) {
  const float third = 1.0f / 3;
  const Struct doc =
      ParseJson(Render({MakeSession("f", "static", "per_tensor", {third})}, Format::kJson));
  const auto& scales = doc.fields()
                           .at("sessions")
                           .list_value()
                           .values(0)
                           .struct_value()
                           .fields()
                           .at("scales")
                           .struct_value()
                           .fields();
  EXPECT_EQ(static_cast<float>(scales.at("min").number_value()), third);
  EXPECT_EQ(scales.at("max_over_min").number_value(), 1);
}

TEST(CoverageReport, HtmlHasOnePlotPerInitializedSessionUninitializedFirst) {
  std::vector<v1::Session> sessions = ThreeSessions();
  sessions.push_back(MakeSession("run/d", "static", "per_tensor", {}));
  std::string page;
  Render(sessions, Format::kJson, &page);
  EXPECT_TRUE(absl::StartsWith(page, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::EndsWith(page, "</html>\n"));
  EXPECT_EQ(Count(page, "<svg class=\"plot\""), 2u);
  const size_t uninitialized = page.find("<section id=\"uninitialized\">");
  const size_t first_plot = page.find("<svg class=\"plot\"");
  ASSERT_NE(uninitialized, std::string::npos);
  EXPECT_LT(uninitialized, first_plot);
  EXPECT_LT(page.find("<td class=\"name\">run/b</td>"), first_plot);
  EXPECT_LT(page.find("<td class=\"name\">run/d</td>"), first_plot);
  EXPECT_TRUE(absl::StrContains(page, "Uninitialized sessions (2)"));
  // The running session plots its range and its scales; the static one its scales.
  EXPECT_EQ(Count(page, "<polygon class=\"range\""), 1u);
  EXPECT_EQ(Count(page, "<polyline class=\"scale\""), 2u);
  EXPECT_TRUE(absl::StrContains(page, "no running range"));
  // One file: nothing to fetch, nothing to run.
  EXPECT_FALSE(absl::StrContains(page, "<script"));
  EXPECT_FALSE(absl::StrContains(page, "://"));
  EXPECT_FALSE(absl::StrContains(page, "src="));
  EXPECT_FALSE(absl::StrContains(page, "href"));
  EXPECT_TRUE(absl::StrContains(page, "default-src 'none'"));
}

// Each plot goes to the sink as its session is added, not at the end: the report
// holds one plot at a time, however many sessions. The page copies them back in order.
TEST(CoverageReport, PlotsGoToTheSinkAsTheyAreAdded) {
  std::ostringstream out;
  std::stringstream plots;
  CoverageReport report("run/", Format::kJson, &plots, out);
  const std::vector<v1::Session> sessions = ThreeSessions();
  report.Add(sessions[0]);  // run/a, initialized
  const std::string after_a = plots.str();
  EXPECT_EQ(Count(after_a, "<svg class=\"plot\""), 1u);
  EXPECT_TRUE(absl::StrContains(after_a, "<h3>run/a</h3>"));
  report.Add(sessions[1]);  // run/b, uninitialized: no plot
  EXPECT_EQ(plots.str(), after_a);
  report.Add(sessions[2]);  // run/c
  EXPECT_EQ(Count(plots.str(), "<svg class=\"plot\""), 2u);
  EXPECT_GT(plots.str().size(), after_a.size());
  report.Finish();

  std::ostringstream html;
  ASSERT_TRUE(report.WriteHtml(html).ok());
  const std::string page = html.str();
  EXPECT_TRUE(absl::StrContains(page, plots.str()));
  EXPECT_LT(page.find("<td class=\"name\">run/b</td>"), page.find(plots.str()));
  EXPECT_TRUE(absl::EndsWith(page, "</section>\n</section>\n</body>\n</html>\n"));
}

TEST(CoverageReport, AFailedSinkIsDataLoss) {
  std::ostringstream out;
  std::stringstream plots;
  CoverageReport report("run/", Format::kTable, &plots, out);
  for (const v1::Session& s : ThreeSessions()) report.Add(s);
  report.Finish();
  plots.setstate(std::ios::badbit);  // as a full disk would leave it
  std::ostringstream html;
  const absl::Status status = report.WriteHtml(html);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "plots")) << status;
}

TEST(CoverageReport, NamesAreEscaped) {
  const std::string name = "x<b>&\"y'";
  std::string page;
  const std::string json = Render({MakeSession(name, "static", "per_tensor", {1}),
                                   MakeSession(name + "2", "static", "per_tensor", {})},
                                  Format::kJson, &page);
  EXPECT_FALSE(absl::StrContains(page, "<b>"));
  EXPECT_TRUE(absl::StrContains(page, "<h3>x&lt;b&gt;&amp;&quot;y&#39;</h3>"));
  EXPECT_TRUE(absl::StrContains(page, "<td class=\"name\">x&lt;b&gt;&amp;&quot;y&#39;2</td>"));
  const Struct doc = ParseJson(json);
  EXPECT_EQ(doc.fields()
                .at("sessions")
                .list_value()
                .values(0)
                .struct_value()
                .fields()
                .at("name")
                .string_value(),
            name);
  EXPECT_EQ(doc.fields().at("uninitialized").list_value().values(0).string_value(), name + "2");
}

TEST(CoverageReport, LargeSessionsAreDownsampledToTheEnvelope) {
  std::vector<float> scales(10000), lo(10000), hi(10000);
  for (int i = 0; i < 10000; ++i) {
    scales[i] = 0.01f * static_cast<float>(1 + i % 97);
    lo[i] = -static_cast<float>(i % 13);
    hi[i] = static_cast<float>(i % 101);
  }
  hi[5000] = 1000;  // one channel far out: the envelope keeps it
  std::string page;
  Render({MakeSession("big", "global_minmax", "per_channel:0", scales, lo, hi)}, Format::kJson,
         &page);
  EXPECT_EQ(Count(page, "<svg class=\"plot\""), 1u);
  EXPECT_LT(page.size(), 64u << 10);
  for (const std::string attr :
       {"<polygon class=\"range\" points=\"", "<polygon class=\"scale-band\" points=\""}) {
    const size_t at = page.find(attr);
    ASSERT_NE(at, std::string::npos) << attr;
    const size_t start = at + attr.size();
    const absl::string_view points(page.data() + start, page.find('"', start) - start);
    // The upper edge forward, the lower edge back: two points per drawn position.
    EXPECT_EQ(Count(points, ","), 2u * report::kMaxPlotPoints) << attr;
  }
  EXPECT_TRUE(absl::StrContains(page, "1000</text>")) << "the y axis reaches the outlier";
  EXPECT_TRUE(absl::StrContains(page, "channel (axis 0) 0 to 9999 of 10000"));
  EXPECT_TRUE(absl::StrContains(page, "; each point: up to 20 adjacent, least to greatest"));
}

// histogram.md's worked example (12) as a percentile-50 session and its histogram:
// [-3.0, 0.5, 1.0, 2.0, 2.5, 7.3] in 256 bins of 2^-5, amax 2.0 at bin 64.
v1::Session WorkedSession() {
  v1::Session s = MakeSession("run/h", "percentile", "per_tensor", {2.0f / 127.5f});
  s.mutable_histogram()->set_num_bins(256);
  s.mutable_histogram()->set_percentile(50);
  v1::CalibrationResult* c = s.mutable_calibration();
  c->set_amax(2.0);
  c->set_bin_index(64);
  c->set_exponent(-5);
  c->set_total_count(6);
  return s;
}

v1::HistogramObservation WorkedHistogram() {
  v1::HistogramObservation h;
  h.set_num_bins(256);
  h.set_exponent(-5);
  h.mutable_counts()->Resize(234, 0);
  for (const int k : {16, 32, 64, 80, 96, 233}) h.set_counts(k, 1);
  h.set_negative_count(1);
  h.set_min(-3.0);
  h.set_max(static_cast<double>(7.3f));
  return h;
}

std::string PageOf(const v1::Session& session, const v1::HistogramObservation* histogram) {
  std::ostringstream out;
  std::stringstream plots;
  CoverageReport report("run/", Format::kJson, &plots, out);
  report.Add(session, histogram);
  report.Finish();
  std::ostringstream html;
  EXPECT_TRUE(report.WriteHtml(html).ok());
  return html.str();
}

// The x1 of the first `<line class="CSS_CLASS"` in `page`; -1 if there is none.
double LineX(const std::string& page, absl::string_view css_class) {
  const std::string tag = absl::StrCat("<line class=\"", css_class, "\" x1=\"");
  const size_t at = page.find(tag);
  if (at == std::string::npos) return -1;
  return std::stod(page.substr(at + tag.size()));
}

TEST(CoverageReport, HistogramSessionsPlotTheirHistogramWithBothMarkers) {
  const v1::HistogramObservation histogram = WorkedHistogram();
  const std::string page = PageOf(WorkedSession(), &histogram);
  EXPECT_EQ(Count(page, "<svg class=\"plot\""), 1u);
  EXPECT_EQ(Count(page, "<path class=\"hist\""), 1u);
  EXPECT_FALSE(absl::StrContains(page, "<polyline class=\"scale\"")) << "the histogram instead";
  EXPECT_TRUE(absl::StrContains(page, ">amax (percentile) = 2</text>")) << page;
  EXPECT_TRUE(absl::StrContains(page, ">max |x| = 7.3</text>")) << page;
  // x is |x| from 0 to the last occupied bin's upper edge, 234/32: the markers sit in
  // proportion.
  const double left = 76, right = 720 - 12;
  const double amax_x = LineX(page, "amax"), max_x = LineX(page, "max-abs");
  EXPECT_NEAR(amax_x, left + (right - left) * 2.0 / 7.3125, 0.1);
  EXPECT_NEAR(max_x, left + (right - left) * 7.3 / 7.3125, 0.1);
  // log10(count + 1): the single values rise from zero, the empty bins between stay on it.
  const size_t d = page.find("<path class=\"hist\" d=\"");
  const std::string path = page.substr(d, page.find("/>", d) - d);
  EXPECT_EQ(Count(path, " V"), 234u + 1) << "a column per bin, and the way down";
  EXPECT_TRUE(absl::StrContains(path, " V178.0 H")) << "an empty bin at zero: " << path;
  // The calibration and the histogram's own counts are written out beside the plot.
  EXPECT_TRUE(absl::StrContains(
      page,
      "calibration: amax 2, bin_index 64, exponent -5, total_count 6<br>histogram: "
      "num_bins 256, 234 occupied, 6 finite values (zeros 0, negative 1), NaN 0"))
      << page;
  EXPECT_TRUE(absl::StrContains(page, "234 occupied bins of 2^-5 (0.03125)"));
  EXPECT_FALSE(absl::StrContains(page, "no running range"));
  EXPECT_FALSE(absl::StrContains(page, "read after the calibration"));
  EXPECT_FALSE(absl::StrContains(page, "://"));
}

TEST(CoverageReport, LargeHistogramsAreSummedIntoColumns) {
  v1::HistogramObservation histogram;
  histogram.set_num_bins(65536);
  histogram.set_exponent(-10);
  for (int k = 0; k < 65536; ++k) histogram.add_counts(k == 40000 ? 1000000 : 1);
  histogram.set_min(0);
  histogram.set_max(63.99);
  v1::Session session = WorkedSession();
  session.mutable_calibration()->set_amax(40.0);
  session.mutable_calibration()->set_total_count(65535 + 1000000);
  const std::string page = PageOf(session, &histogram);
  const size_t d = page.find("<path class=\"hist\" d=\"");
  ASSERT_NE(d, std::string::npos);
  EXPECT_EQ(Count(page.substr(d, page.find("/>", d) - d), " V"), report::kMaxHistogramColumns + 1u);
  EXPECT_TRUE(absl::StrContains(page, "; each column: 256 adjacent bins summed"));
  EXPECT_LT(page.size(), 32u << 10);
  // Decades up to the peak column's count, 1000255: 1, 10, ..., 1e+06.
  EXPECT_TRUE(absl::StrContains(page, "class=\"y\">1e+06</text>")) << page;
  EXPECT_TRUE(absl::StrContains(page, ">amax (percentile) = 40</text>"));
  EXPECT_TRUE(absl::StrContains(page, ">max |x| = 63.99</text>"));
}

// The CLI reads the histogram after the session: observations in between are noted,
// and a histogram that could not be read leaves the scale plot and says so.
TEST(CoverageReport, HistogramReadLaterOrNotAtAll) {
  const v1::HistogramObservation histogram = WorkedHistogram();
  v1::Session earlier = WorkedSession();
  earlier.mutable_calibration()->set_total_count(5);
  EXPECT_TRUE(absl::StrContains(PageOf(earlier, &histogram),
                                "the histogram was read after the calibration and holds 6 finite "
                                "values against its 5"));

  const std::string page = PageOf(WorkedSession(), nullptr);
  EXPECT_FALSE(absl::StrContains(page, "<path class=\"hist\""));
  EXPECT_EQ(Count(page, "<polyline class=\"scale\""), 1u);
  EXPECT_TRUE(absl::StrContains(page, "no histogram: it could not be read"));
  EXPECT_TRUE(absl::StrContains(page, "calibration: amax 2, bin_index 64"));
}

TEST(CoverageReport, SpreadAndNonFiniteCounts) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  v1::Session s = MakeSession("nf", "static", "per_channel:0", {2, nan, 0.5f, 1, inf, 4});
  const std::optional<report::ScaleSpread> spread = report::SpreadOf(s);
  ASSERT_TRUE(spread.has_value());
  EXPECT_EQ(spread->count, 6);
  EXPECT_EQ(spread->nan, 1);       // left out of the order
  EXPECT_EQ(spread->min, 0.5f);    // over 0.5, 1, 2, 4, inf
  EXPECT_EQ(spread->median, 2);    // their middle
  EXPECT_EQ(spread->max, inf);     // shown, not left out
  EXPECT_EQ(spread->max_over_min, std::numeric_limits<double>::infinity());
  // Scale and minval (-v * 128) each hold a NaN and an infinity.
  EXPECT_EQ(report::NonFiniteCount(s), 4);
  // Still valid JSON, the count in it.
  const Struct doc = ParseJson(Render({s}, Format::kJson));
  EXPECT_EQ(doc.fields()
                .at("sessions")
                .list_value()
                .values(0)
                .struct_value()
                .fields()
                .at("non_finite")
                .number_value(),
            4);
  std::string page;
  Render({s}, Format::kJson, &page);
  EXPECT_TRUE(absl::StrContains(page, "non_finite 4"));

  EXPECT_FALSE(report::SpreadOf(MakeSession("u", "static", "per_tensor", {})).has_value());
  const std::optional<report::ScaleSpread> zero =
      report::SpreadOf(MakeSession("z", "static", "per_channel:0", {0, 1}));
  ASSERT_TRUE(zero.has_value());
  EXPECT_FALSE(zero->max_over_min.has_value());
  EXPECT_TRUE(absl::StrContains(
      Render({MakeSession("z", "static", "per_channel:0", {0, 1})}, Format::kJson),
      "\"max_over_min\": null"));
}

// A session whose scale overflowed (a range wider than float32's largest value) is
// summarized as inf in every format, never as 0; one whose scales are all NaN has no
// spread values. The JSON stays valid: infinities as protobuf's JSON mapping writes them.
TEST(CoverageReport, InfiniteScalesShowAsInfNotZero) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<v1::Session> sessions = {
      MakeSession("inf/all", "global_minmax", "per_tensor", {inf}),
      MakeSession("inf/nan", "static", "per_tensor", {nan}),
      MakeSession("inf/some", "static", "per_channel:0", {inf, 0.5f, inf})};

  const std::string table = Render(sessions, Format::kTable);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << table;
  auto spread_cells = [](absl::string_view line) {
    const std::vector<absl::string_view> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
    return std::vector<std::string>(cells.end() - 5, cells.end());
  };
  EXPECT_EQ(spread_cells(lines[1]), (std::vector<std::string>{"1", "inf", "inf", "inf", "-"}));
  EXPECT_EQ(spread_cells(lines[2]), (std::vector<std::string>{"1", "-", "-", "-", "-"}));
  EXPECT_EQ(spread_cells(lines[3]), (std::vector<std::string>{"3", "0.5", "inf", "inf", "inf"}));

  const Struct doc = ParseJson(Render(sessions, Format::kJson));
  const auto& rows = doc.fields().at("sessions").list_value().values();
  ASSERT_EQ(rows.size(), 3);
  auto scales = [&rows](int i) -> const google::protobuf::Map<std::string, Value>& {
    return rows[i].struct_value().fields().at("scales").struct_value().fields();
  };
  EXPECT_EQ(scales(0).at("min").string_value(), "Infinity");
  EXPECT_EQ(scales(0).at("median").string_value(), "Infinity");
  EXPECT_EQ(scales(0).at("max").string_value(), "Infinity");
  EXPECT_EQ(scales(0).at("max_over_min").kind_case(), Value::kNullValue);
  EXPECT_EQ(scales(0).at("nan").number_value(), 0);
  EXPECT_EQ(scales(1).at("nan").number_value(), 1);
  EXPECT_EQ(scales(1).at("min").kind_case(), Value::kNullValue);
  EXPECT_EQ(scales(1).at("max").kind_case(), Value::kNullValue);
  EXPECT_EQ(scales(2).at("min").number_value(), 0.5);
  EXPECT_EQ(scales(2).at("max").string_value(), "Infinity");
  EXPECT_EQ(scales(2).at("max_over_min").string_value(), "Infinity");

  std::string page;
  Render(sessions, Format::kJson, &page);
  EXPECT_TRUE(absl::StrContains(page, "scales: count 1, min inf, median inf, max inf, max/min -"))
      << page;
  EXPECT_TRUE(absl::StrContains(page, "scales: count 1, min -, median -, max -, max/min -, NaN 1"))
      << page;
}

TEST(CoverageReport, SpecSummary) {
  v1::QuantSpec spec;
  EXPECT_EQ(report::SpecSummary(spec), "int8 symmetric per_tensor weight");
  spec.set_dtype("float4_e2m1fn_x2");
  spec.set_target(v1::ACTIVATION);
  spec.set_scale_dtype("float8_e8m0fnu");
  spec.mutable_granularity()->mutable_per_block()->add_block_size(4);
  spec.mutable_granularity()->mutable_per_block()->add_block_size(-1);
  spec.mutable_float_range()->set_min(-2.5);
  EXPECT_EQ(report::SpecSummary(spec),
            "float4_e2m1fn_x2 symmetric per_block:4,-1 activation scale_dtype=float8_e8m0fnu "
            "float_range=[-2.5, observed]");
}

// Rendering is linear in the sessions: 100,000 of them go through each format in a
// few seconds (quadratic behaviour would not finish within ctest's timeout).
TEST(CoverageReport, HundredThousandSessions) {
  constexpr int kSessions = 100000;
  for (const Format format : {Format::kJson, Format::kTable}) {
    std::ostringstream out;
    std::stringstream plots;
    std::ostringstream html;
    CoverageReport report("many/", format, format == Format::kJson ? &plots : nullptr, out);
    for (int i = 0; i < kSessions; ++i) {
      report.Add(MakeSession(absl::StrCat("many/", i), "global_minmax", "per_channel:0",
                             i % 10 == 0 ? std::vector<float>{} : std::vector<float>{1, 2},
                             i % 10 == 0 ? std::vector<float>{} : std::vector<float>{-1, -2},
                             i % 10 == 0 ? std::vector<float>{} : std::vector<float>{1, 2}));
    }
    report.Finish();
    if (format == Format::kJson) {
      ASSERT_TRUE(report.WriteHtml(html).ok());
      EXPECT_EQ(Count(html.str(), "<svg class=\"plot\""), kSessions - kSessions / 10);
      // Parsing 35 MB back would cost more than the report; the small cases parse it.
      EXPECT_EQ(Count(out.str(), "{\"name\": "), static_cast<size_t>(kSessions));
      EXPECT_TRUE(absl::EndsWith(out.str(),
                                 "\"session_count\": 100000,\n \"initialized_count\": 90000\n}\n"));
    } else {
      EXPECT_EQ(Count(out.str(), "\n"), kSessions + 3u);
    }
  }
}

// ---------------------------------------------------------------- the command

class ReportCommand : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = TestServer::Start().release();
    ASSERT_NE(server_, nullptr);
    std::string dir = absl::StrCat(::testing::TempDir(), "/report_test.XXXXXX");
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = new std::string(dir);

    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    for (const char* name : {"cmd/a", "cmd/b", "cmd/c"}) {
      v1::CreateSessionRequest request;
      request.set_name(name);
      request.set_calculator(absl::string_view(name) == "cmd/c" ? "static" : "global_minmax");
      request.mutable_spec()->mutable_granularity()->mutable_per_channel()->set_axis(0);
      ASSERT_TRUE((*client)->CreateSession(request).ok()) << name;
    }
    const Tensor x = F32({4, 8}, RandN(32, 1));
    ASSERT_TRUE((*client)->Observe("cmd/a", x.view()).ok());
    ASSERT_TRUE((*client)->Observe("cmd/c", x.view()).ok());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }

  struct Result {
    int exit_code;
    std::string out;
    std::string err;
  };

  static Result Run(cli::Options options) {
    options.target = server_->address();
    std::ostringstream out, err;
    const int exit_code = cli::Run({"report"}, options, out, err);
    return {exit_code, out.str(), err.str()};
  }

  static TestServer* server_;
  static std::string* dir_;
};

TestServer* ReportCommand::server_ = nullptr;
std::string* ReportCommand::dir_ = nullptr;

TEST_F(ReportCommand, WritesTheReportAndThePage) {
  cli::Options options;
  options.prefix = "cmd/";
  options.format = "table";
  options.html = absl::StrCat(*dir_, "/report.html");
  const Result r = Run(options);
  ASSERT_EQ(r.exit_code, cli::kExitOk) << r.err;
  EXPECT_EQ(r.err, "");
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << r.out;
  EXPECT_TRUE(absl::StartsWith(lines[1], "cmd/b  global_minmax  int8 symmetric per_channel:0"))
      << r.out;
  EXPECT_TRUE(absl::StartsWith(lines[2], "cmd/a")) << r.out;
  EXPECT_TRUE(absl::StartsWith(lines[3], "cmd/c")) << r.out;

  std::ifstream file(options.html);
  std::stringstream page;
  page << file.rdbuf();
  EXPECT_EQ(Count(page.str(), "<svg class=\"plot\""), 2u);
  EXPECT_EQ(Count(page.str(), "<polygon class=\"range\""), 1u);  // cmd/a's; cmd/c is static
  EXPECT_NE(access(absl::StrCat(options.html, ".partial").c_str(), F_OK), 0);
  EXPECT_NE(access(absl::StrCat(options.html, ".partial.plots").c_str(), F_OK), 0);
  // The uninitialized section, then the plots copied from the temporary file.
  EXPECT_LT(page.str().find("<td class=\"name\">cmd/b</td>"), page.str().find("<h3>cmd/a</h3>"));
  EXPECT_LT(page.str().find("<h3>cmd/a</h3>"), page.str().find("<h3>cmd/c</h3>"));
  EXPECT_TRUE(absl::EndsWith(page.str(), "</html>\n"));

  options.format = "json";
  options.html.clear();
  const Result json = Run(options);
  ASSERT_EQ(json.exit_code, cli::kExitOk) << json.err;
  EXPECT_EQ(ParseJson(json.out).fields().at("session_count").number_value(), 3);
}

// A histogram session's plot is its histogram, read with GetHistogram, marked at the
// calibration's amax and at max |x|; an uninitialized one is listed and not read.
TEST_F(ReportCommand, PlotsHistogramSessionsWithTheirMarkers) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address()));
  for (const char* name : {"hist/entropy", "hist/unobserved"}) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator("entropy");
    request.mutable_histogram()->set_num_bins(256);
    ASSERT_OK(client->CreateSession(request));
  }
  std::vector<double> values = RandN(2000, 24, 1.5);
  values[7] = -9.25;  // far out: max |x| well beyond amax
  ASSERT_OK(client->Observe("hist/entropy", Vec(values).view()));
  ASSERT_OK_AND_ASSIGN(const v1::Session session, client->GetSession("hist/entropy"));
  ASSERT_TRUE(session.has_calibration());

  cli::Options options;
  options.prefix = "hist/";
  options.format = "table";
  options.html = absl::StrCat(*dir_, "/hist.html");
  const Result r = Run(options);
  ASSERT_EQ(r.exit_code, cli::kExitOk) << r.err;
  EXPECT_EQ(r.err, "");
  std::ifstream file(options.html);
  std::stringstream read;
  read << file.rdbuf();
  const std::string page = read.str();
  EXPECT_EQ(Count(page, "<svg class=\"plot\""), 1u);
  EXPECT_EQ(Count(page, "<path class=\"hist\""), 1u);
  EXPECT_TRUE(absl::StrContains(
      page, absl::StrFormat(">amax (entropy) = %.4g</text>", session.calibration().amax())))
      << page;
  EXPECT_TRUE(absl::StrContains(page, ">max |x| = 9.25</text>")) << page;
  EXPECT_TRUE(absl::StrContains(
      page,
      absl::StrCat("calibration: amax ", absl::StrFormat("%.9g", session.calibration().amax()),
                   ", bin_index ", session.calibration().bin_index())));
  EXPECT_TRUE(absl::StrContains(page, "<td class=\"name\">hist/unobserved</td>"));
}

// A range wider than float32's largest value overflows the scale to inf on the server;
// the report says so rather than 0.
TEST_F(ReportCommand, ASessionWhoseScaleOverflowedShowsInf) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address()));
  v1::CreateSessionRequest request;
  request.set_name("overflow/act");
  request.set_calculator("global_minmax");
  request.mutable_spec()->set_target(v1::ACTIVATION);
  request.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  ASSERT_OK(client->CreateSession(request));
  ASSERT_OK(client->Observe("overflow/act", Vec({-3e38, 3e38}).view()));

  cli::Options options;
  options.prefix = "overflow/";
  options.format = "table";
  const Result r = Run(options);
  ASSERT_EQ(r.exit_code, cli::kExitOk) << r.err;
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << r.out;
  const std::vector<absl::string_view> cells = absl::StrSplit(lines[1], ' ', absl::SkipEmpty());
  ASSERT_GE(cells.size(), 6u) << lines[1];
  // NON_FINITE (the scale; its minval and running range are finite), then the spread.
  EXPECT_EQ(std::vector<absl::string_view>(cells.end() - 6, cells.end()),
            (std::vector<absl::string_view>{"1", "1", "inf", "inf", "inf", "-"}))
      << r.out;
}

TEST_F(ReportCommand, AnUnwritablePageFailsNamingTheFile) {
  cli::Options options;
  options.prefix = "cmd/";
  options.html = absl::StrCat(*dir_, "/no/such/dir/report.html");
  const Result r = Run(options);
  EXPECT_EQ(r.exit_code, cli::kExitFailed);
  EXPECT_TRUE(absl::StartsWith(
      r.err, absl::StrCat("error: FAILED_PRECONDITION: --html ", options.html, ": cannot write")))
      << r.err;
  EXPECT_EQ(r.out, "") << "fails before any session is read";
}

TEST_F(ReportCommand, AFailedCallLeavesNoPage) {
  cli::Options options;
  options.prefix = "bad prefix!";  // characters no name holds
  options.html = absl::StrCat(*dir_, "/failed.html");
  const Result r = Run(options);
  EXPECT_EQ(r.exit_code, cli::kExitFailed);
  EXPECT_TRUE(absl::StartsWith(r.err, "error: INVALID_ARGUMENT: ")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "prefix")) << r.err;
  EXPECT_NE(access(options.html.c_str(), F_OK), 0);
  EXPECT_NE(access(absl::StrCat(options.html, ".partial").c_str(), F_OK), 0);
  EXPECT_NE(access(absl::StrCat(options.html, ".partial.plots").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace qparams::testing
