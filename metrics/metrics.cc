#include "metrics/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace qparams {
namespace {

// Prometheus' metric and label name rules; the names are this program's constants,
// so a violation is a bug caught by the debug builds (tests).
[[maybe_unused]] bool ValidName(absl::string_view name, bool label) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  return std::all_of(name.begin(), name.end(), [label](char c) {
    return absl::ascii_isalnum(c) || c == '_' || (!label && c == ':');
  });
}

[[maybe_unused]] bool ValidLabels(const std::vector<std::string>& label_names) {
  return std::all_of(label_names.begin(), label_names.end(), [](const std::string& label) {
    return ValidName(label, /*label=*/true) && label != "le" && label.rfind("__", 0) != 0;
  });
}

// `{a="x",b="y"}` (with `extra`, e.g. le="0.5", last), or nothing without labels.
void AppendLabels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                  absl::string_view extra, std::string& out) {
  if (names.empty() && extra.empty()) return;
  out += '{';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, names.empty() ? "" : ",", extra);
  out += '}';
}

void AppendSample(absl::string_view name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, absl::string_view extra,
                  absl::string_view value, std::string& out) {
  out.append(name.data(), name.size());
  AppendLabels(label_names, values, extra, out);
  absl::StrAppend(&out, " ", value, "\n");
}

void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest %g that reads back as the same double: 0.00025, not
  // 0.00025000000000000000520.
  char buffer[32];
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {  // 10, not 1e+01
    std::snprintf(buffer, sizeof buffer, "%.0f", value);
    return buffer;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

BucketHistogram::BucketHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  assert(std::is_sorted(bounds_.begin(), bounds_.end()) &&
         std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end());
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void BucketHistogram::Observe(double value) {
  // The first bound >= value; past the end is the +Inf bucket (NaN lands there too).
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

std::vector<uint64_t> BucketHistogram::BucketCounts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = counts_[i].load(std::memory_order_relaxed);
  return counts;
}

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

template <typename Metric>
Metric* Family<Metric>::WithLabels(const std::vector<std::string>& values) {
  assert(values.size() == label_count_);
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Metric>& metric = series_[values];
  if (metric == nullptr) metric = Make();
  return metric.get();
}

template <typename Metric>
std::vector<std::pair<std::vector<std::string>, const Metric*>> Family<Metric>::Series() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::vector<std::string>, const Metric*>> out;
  out.reserve(series_.size());
  for (const auto& [labels, metric] : series_) out.emplace_back(labels, metric.get());
  return out;
}

template <>
std::unique_ptr<Counter> Family<Counter>::Make() const {
  return std::make_unique<Counter>();
}
template <>
std::unique_ptr<Gauge> Family<Gauge>::Make() const {
  return std::make_unique<Gauge>();
}
template <>
std::unique_ptr<BucketHistogram> Family<BucketHistogram>::Make() const {
  return std::make_unique<BucketHistogram>(bounds_);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<BucketHistogram>;

struct MetricsRegistry::Entry {
  std::string name;
  std::string help;
  const char* type = "";
  std::vector<std::string> label_names;
  // Exactly one of these is set.
  std::unique_ptr<Family<Counter>> counters;
  std::unique_ptr<Family<Gauge>> gauges;
  std::unique_ptr<Family<BucketHistogram>> histograms;
  GaugeCallback callback;

  void Render(std::string& out) const {
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type,
                    "\n");
    if (counters != nullptr) {
      for (const auto& [labels, counter] : counters->Series()) {
        AppendSample(name, label_names, labels, "", absl::StrCat(counter->value()), out);
      }
    } else if (gauges != nullptr) {
      for (const auto& [labels, gauge] : gauges->Series()) {
        AppendSample(name, label_names, labels, "", FormatMetricValue(gauge->value()), out);
      }
    } else if (histograms != nullptr) {
      const std::string bucket = absl::StrCat(name, "_bucket");
      for (const auto& [labels, histogram] : histograms->Series()) {
        const std::vector<uint64_t> counts = histogram->BucketCounts();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le =
              i < histogram->bounds().size() ? FormatMetricValue(histogram->bounds()[i]) : "+Inf";
          AppendSample(bucket, label_names, labels, absl::StrCat("le=\"", le, "\""),
                       absl::StrCat(cumulative), out);
        }
        AppendSample(absl::StrCat(name, "_sum"), label_names, labels, "",
                     FormatMetricValue(histogram->sum()), out);
        AppendSample(absl::StrCat(name, "_count"), label_names, labels, "",
                     absl::StrCat(cumulative), out);
      }
    } else {
      std::vector<GaugeSample> samples = callback();
      std::sort(samples.begin(), samples.end(),
                [](const GaugeSample& a, const GaugeSample& b) { return a.labels < b.labels; });
      for (const GaugeSample& sample : samples) {
        assert(sample.labels.size() == label_names.size());
        AppendSample(name, label_names, sample.labels, "", FormatMetricValue(sample.value), out);
      }
    }
  }
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::Add(std::unique_ptr<Entry> entry) {
  assert(ValidName(entry->name, /*label=*/false) && ValidLabels(entry->label_names));
  absl::MutexLock lock(&mu_);
  assert(std::none_of(entries_.begin(), entries_.end(),
                      [&](const std::unique_ptr<Entry>& e) { return e->name == entry->name; }));
  entries_.push_back(std::move(entry));
}

std::unique_ptr<MetricsRegistry::Entry> MetricsRegistry::NewEntry(
    std::string name, std::string help, const char* type, std::vector<std::string> label_names) {
  auto entry = std::make_unique<Entry>();
  entry->name = std::move(name);
  entry->help = std::move(help);
  entry->type = type;
  entry->label_names = std::move(label_names);
  return entry;
}

Family<Counter>* MetricsRegistry::AddCounter(std::string name, std::string help,
                                             std::vector<std::string> label_names) {
  assert(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0);
  const size_t labels = label_names.size();
  std::unique_ptr<Entry> entry =
      NewEntry(std::move(name), std::move(help), "counter", std::move(label_names));
  entry->counters.reset(new Family<Counter>(labels, {}));
  Family<Counter>* family = entry->counters.get();
  Add(std::move(entry));
  return family;
}

Family<Gauge>* MetricsRegistry::AddGauge(std::string name, std::string help,
                                         std::vector<std::string> label_names) {
  const size_t labels = label_names.size();
  std::unique_ptr<Entry> entry =
      NewEntry(std::move(name), std::move(help), "gauge", std::move(label_names));
  entry->gauges.reset(new Family<Gauge>(labels, {}));
  Family<Gauge>* family = entry->gauges.get();
  Add(std::move(entry));
  return family;
}

Family<BucketHistogram>* MetricsRegistry::AddHistogram(std::string name, std::string help,
                                                       std::vector<std::string> label_names,
                                                       std::vector<double> bounds) {
  const size_t labels = label_names.size();
  std::unique_ptr<Entry> entry =
      NewEntry(std::move(name), std::move(help), "histogram", std::move(label_names));
  entry->histograms.reset(new Family<BucketHistogram>(labels, std::move(bounds)));
  Family<BucketHistogram>* family = entry->histograms.get();
  Add(std::move(entry));
  return family;
}

void MetricsRegistry::AddGaugeCallback(std::string name, std::string help,
                                       std::vector<std::string> label_names,
                                       GaugeCallback callback) {
  std::unique_ptr<Entry> entry =
      NewEntry(std::move(name), std::move(help), "gauge", std::move(label_names));
  entry->callback = std::move(callback);
  Add(std::move(entry));
}

std::string MetricsRegistry::Render() const {
  // Entries are never removed: render outside the lock, so that a callback's locks
  // are never taken under it.
  std::vector<const Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    for (const std::unique_ptr<Entry>& entry : entries_) entries.push_back(entry.get());
  }
  std::string out;
  for (const Entry* entry : entries) entry->Render(out);
  return out;
}

}  // namespace qparams
