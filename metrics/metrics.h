// A small metrics registry: counters, gauges and histograms, each in a family with
// label names, rendered in Prometheus' text exposition format (version 0.0.4). It
// knows nothing of gRPC nor of HTTP: the domain records through it, the gRPC layer
// counts calls through it, and metrics/metrics_http serves Render().
//
// Thread safety: recording (Counter::Increment, Gauge::Set, BucketHistogram::Observe)
// is lock-free, on relaxed atomics, from any thread. Looking a series up by its label
// values (Family::WithLabels) takes the family's mutex: callers on a hot path look a
// series up once and keep the pointer, which lives as long as the registry. Adding
// families and Render may run concurrently with each other and with recording.
// Render reads each value atomically but not all of them at one instant: a
// histogram's buckets and count always agree, its sum may lag them by the
// observations made during the scrape.

#ifndef QPARAMS_METRICS_METRICS_H_
#define QPARAMS_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace qparams {

// A monotonic count. Thread-safe, lock-free.
class Counter {
 public:
  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down. Thread-safe, lock-free.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into buckets by upper bound (Prometheus' "le": a value lands
// in the first bucket whose bound is >= it), plus their sum. Thread-safe, lock-free.
// (Not "Histogram": that is the core's histogram of |x|, core/histogram.h.)
class BucketHistogram {
 public:
  // `bounds` strictly increasing and finite; the +Inf bucket is implicit.
  explicit BucketHistogram(std::vector<double> bounds);

  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative), the last one +Inf's; their total is the count.
  std::vector<uint64_t> BucketCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
};

// Bucket bounds for latencies in seconds: 100 µs to 10 s, 1-2.5-5 per decade.
std::vector<double> LatencyBuckets();

// The series of one metric, one per combination of label values.
template <typename Metric>
class Family {
 public:
  // The series of `values` (one per label name, in order), created at 0 on first
  // use. Thread-safe (the family's mutex); the pointer stays valid as long as the
  // registry.
  Metric* WithLabels(const std::vector<std::string>& values) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class MetricsRegistry;
  // `bounds`: a histogram's bucket bounds (empty for the others).
  Family(size_t label_count, std::vector<double> bounds)
      : label_count_(label_count), bounds_(std::move(bounds)) {}

  // Every series, ordered by label values (so the output is stable).
  std::vector<std::pair<std::vector<std::string>, const Metric*>> Series() const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::unique_ptr<Metric> Make() const;

  const size_t label_count_;
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> series_ ABSL_GUARDED_BY(mu_);
};

// One sample of a gauge computed at scrape time: label values and the value.
struct GaugeSample {
  std::vector<std::string> labels;
  double value = 0;
};

class MetricsRegistry {
 public:
  // Computes a gauge's samples at scrape time; called by Render, from the scraping
  // thread, so it must be thread-safe and cheap (no I/O, short locks).
  using GaugeCallback = std::function<std::vector<GaugeSample>()>;

  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Adds a family. `name` and `label_names` follow Prometheus' rules
  // ([a-zA-Z_:][a-zA-Z0-9_:]*, labels without ':' and not "le"), names are unique,
  // and counters end in "_total" (checked in debug builds only: they are constants
  // of this program). `help` is free text. The family lives as long as the registry.
  // Thread-safe.
  Family<Counter>* AddCounter(std::string name, std::string help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>* AddGauge(std::string name, std::string help,
                          std::vector<std::string> label_names = {});
  Family<BucketHistogram>* AddHistogram(std::string name, std::string help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds);
  // A gauge family whose samples `callback` computes at each Render (`callback`
  // must outlive the registry's last Render).
  void AddGaugeCallback(std::string name, std::string help, std::vector<std::string> label_names,
                        GaugeCallback callback);

  // The text exposition format 0.0.4: for each family in the order added, its HELP
  // and TYPE lines, then its series ordered by label values. Thread-safe.
  std::string Render() const;

  // The Content-Type of Render's output.
  static constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Entry;
  // An entry's description; the caller sets the one family (or callback) it renders.
  static std::unique_ptr<Entry> NewEntry(std::string name, std::string help, const char* type,
                                         std::vector<std::string> label_names);
  void Add(std::unique_ptr<Entry> entry) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

// Text exposition helpers (exposed for the tests): a label value with '\', '"' and
// newline escaped; a HELP text with '\' and newline escaped; a sample value ("+Inf",
// "-Inf", "NaN", or the shortest decimal that reads back as the same double).
std::string EscapeLabelValue(absl::string_view value);
std::string EscapeHelp(absl::string_view help);
std::string FormatMetricValue(double value);

}  // namespace qparams

#endif  // QPARAMS_METRICS_METRICS_H_
