// Throughput of the fused range pass (ObserveRange) against the machine's memory
// bandwidth, measured in the same run as a plain parallel read-and-sum of the same
// buffer. Prints Google Benchmark's table, then a summary with each layout's share of
// the baseline and its target (per_tensor >= 90%, the other layouts >= 80%).

#include <malloc.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "core/granularity.h"
#include "core/range.h"
#include "core/tensor.h"

namespace qparams {
namespace {

constexpr int64_t kRows = 16384;
constexpr int64_t kCols = 4096;  // float32: 256 MiB; bfloat16: 128 MiB

const std::string& Buffer(DType dtype) {
  static std::map<DType, std::string>* buffers = new std::map<DType, std::string>();
  std::string& data = (*buffers)[dtype];
  if (data.empty()) {
    const int64_t n = kRows * kCols;
    data.resize(n * ItemSize(dtype));
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> pool(1 << 16);
    for (float& v : pool) v = normal(rng);
    for (int64_t i = 0; i < n; ++i) {
      const float v = pool[(i * 2654435761u) & (pool.size() - 1)];
      if (dtype == DType::kFloat32) {
        std::memcpy(&data[4 * i], &v, 4);
      } else {
        const uint16_t b = FloatToBFloat16(v);
        std::memcpy(&data[2 * i], &b, 2);
      }
    }
  }
  return data;
}

// Sums `words` 64-bit words with the widest vectors the range pass may use, so the
// baseline is bound by memory, not by arithmetic.
__attribute__((target("avx2"))) uint64_t SumWords(const char* p, int64_t words) {
  uint64_t lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= words; i += 8) {
    for (int l = 0; l < 8; ++l) {
      uint64_t w;
      std::memcpy(&w, p + 8 * (i + l), 8);
      lanes[l] += w;
    }
  }
  uint64_t total = 0;
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    total += w;
  }
  for (uint64_t l : lanes) total += l;
  return total;
}

// The bandwidth baseline: every byte read once, on as many threads as the range pass.
uint64_t ReadAndSum(const std::string& data) {
  const int64_t words = data.size() / 8;
  uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
  {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    const int64_t begin = words * t / threads, end = words * (t + 1) / threads;
    total += SumWords(data.data() + 8 * begin, end - begin);
  }
  return total;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

void BM_ReadAndSum(benchmark::State& state, DType dtype) {
  const std::string& data = Buffer(dtype);
  for (auto _ : state) benchmark::DoNotOptimize(ReadAndSum(data));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(data.size()));
}

// Each iteration times the baseline and then the range pass over the same buffer, so
// the ratio compares the two under the same conditions: this VM's memory bandwidth
// drifts by several times within a minute. The reported time is the range pass's.
void BM_ObserveRange(benchmark::State& state, DType dtype, Granularity granularity) {
  const std::string& data = Buffer(dtype);
  const TensorView x = TensorView::Create(dtype, {kRows, kCols}, data).value();
  const Shape block = granularity.BlockShape(x.shape()).value();
  double baseline_seconds = 0, range_seconds = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(ReadAndSum(data));
    baseline_seconds += Seconds(start);
    start = std::chrono::steady_clock::now();
    absl::StatusOr<BlockRange> range = ObserveRange(x, block);
    const double seconds = Seconds(start);
    if (!range.ok()) state.SkipWithError(std::string(range.status().message()).c_str());
    benchmark::DoNotOptimize(range);
    range_seconds += seconds;
    state.SetIterationTime(seconds);
  }
  const double bytes = static_cast<double>(state.iterations()) * data.size();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["baseline_GBps"] = bytes / baseline_seconds / 1e9;
  state.counters["ratio"] = baseline_seconds / range_seconds;
}

struct Layout {
  const char* name;
  Granularity granularity;
  double target;  // share of the read-and-sum bandwidth
};

const std::vector<Layout>& Layouts() {
  static const auto* layouts = new std::vector<Layout>{
      {"per_tensor", Granularity::PerTensor(), 0.90},
      {"per_channel_axis0", Granularity::PerChannel(0), 0.80},
      {"per_channel_last_axis", Granularity::PerChannel(-1), 0.80},
      {"per_block_32_last_axis", Granularity::PerBlock(-1, 32), 0.80},
  };
  return *layouts;
}

// Keeps each run's bytes/s for the summary.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      for (const auto& [name, counter] : run.counters) {
        counters[run.benchmark_name()][name] = counter.value;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, std::map<std::string, double>> counters;
};

std::string Name(const std::string& what, DType dtype) {
  return absl::StrFormat("%s/%s", what, DTypeName(dtype));
}

}  // namespace
}  // namespace qparams

int main(int argc, char** argv) {
  using namespace qparams;
  // A long-running process reuses the memory it frees. glibc by default hands
  // multi-megabyte blocks back to the kernel at each free, and on this VM faulting
  // the next call's output pages in costs more than the pass itself; keeping them
  // measures the steady state a server sees.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16};
  for (DType dtype : dtypes) {
    benchmark::RegisterBenchmark(Name("read_and_sum", dtype).c_str(), BM_ReadAndSum, dtype)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    for (const auto& layout : Layouts()) {
      benchmark::RegisterBenchmark(
          Name(absl::StrFormat("observe_range/%s", layout.name), dtype).c_str(), BM_ObserveRange,
          dtype, layout.granularity)
          ->UseManualTime()
          ->MinTime(1.0)
          ->Repetitions(5)
          ->ReportAggregatesOnly(true)
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  CapturingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  std::cout << "\nThroughput of the range pass vs. a read-and-sum of the same buffer, timed in\n"
            << "alternation within each iteration; medians of 5 repetitions (" << kRows << " x "
            << kCols << ", " << omp_get_max_threads() << " threads)\n\n"
            << "| dtype | layout | GB/s | baseline GB/s | ratio | target |\n"
            << "|---|---|---|---|---|---|\n";
  bool all_met = true;
  for (DType dtype : dtypes) {
    for (const auto& layout : Layouts()) {
      // The median of the repetitions; run names carry the options after the name.
      const std::string name = Name(absl::StrFormat("observe_range/%s", layout.name), dtype) + "/";
      auto it = reporter.counters.lower_bound(name);
      while (it != reporter.counters.end() && it->first.compare(0, name.size(), name) == 0 &&
             !absl::EndsWith(it->first, "_median")) {
        ++it;
      }
      if (it == reporter.counters.end() || it->first.compare(0, name.size(), name) != 0) continue;
      std::map<std::string, double>& c = it->second;
      const bool met = c["ratio"] >= layout.target;
      all_met &= met;
      std::cout << absl::StrFormat("| %s | %s | %.2f | %.2f | %.0f%% | >= %.0f%% %s |\n",
                                   DTypeName(dtype), layout.name, c["bytes_per_second"] / 1e9,
                                   c["baseline_GBps"], 100 * c["ratio"], 100 * layout.target,
                                   met ? "met" : "MISSED");
    }
  }
  std::cout << "\n" << (all_met ? "all targets met" : "some targets missed") << "\n";
  benchmark::Shutdown();
  return 0;
}
