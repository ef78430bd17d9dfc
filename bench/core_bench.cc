// Throughput of the fused range pass (ObserveRange) against the machine's memory
// bandwidth, measured in the same run as a plain parallel read-and-sum of the same
// buffer. Prints Google Benchmark's table, then a summary with each layout's share of
// the baseline and its target (per_tensor >= 90%, the other layouts >= 80%).
//
// The histogram calculators (histogram.md): binning |x| of a 256 MiB float32 tensor
// (BinTensor, 4096 bins) against the same read-and-sum (target >= 25%), and the
// entropy and mse searches on a full histogram, in milliseconds per search (target:
// entropy at the defaults < 100 ms), each printed as a table after the range pass's.
//
// NVFP4 (nvfp4.md §3): the block scales of a 4096 x 4096 bfloat16 weight (per_block 16
// on the last axis, float8_e4m3fn codes, the global scale from the tensor's amax) as
// the dynamic calculator computes them, in each convention, against the same
// read-and-sum of the weight's buffer (target >= 50%).
//
//   core_bench [--histogram_data=PATH] [--nvfp4_data=PATH] [--json=PATH]
//              [Google Benchmark flags]
//
// --histogram_data writes the binning benchmark's tensor (raw little-endian float32)
// to PATH and the core's histogram of it to PATH.json, for bench/histogram_bench.py
// to time torch.histc and torch.bincount on the same data and check its counts.
// --nvfp4_data does the same for the NVFP4 weight and its block codes, for
// bench/nvfp4_bench.py (WriteNvfp4Data says what it writes).
// --json writes the summary figures as one JSON object.

#include <malloc.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "benchmark/benchmark.h"
#include "core/calibration.h"
#include "core/granularity.h"
#include "core/histogram.h"
#include "core/nvfp4.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/qparams_calculator.h"
#include "core/quant_spec.h"
#include "core/range.h"
#include "core/registry.h"
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

// ---------------------------------------------------------------- NVFP4

// A weight as NVFP4 checkpoints hold it: [out, in] bfloat16, blocks of 16 along in.
constexpr int64_t kNvfp4Rows = 4096;
constexpr int64_t kNvfp4Cols = 4096;  // 32 MiB
constexpr uint32_t kNvfp4Seed = 4;

// kNvfp4Rows x kNvfp4Cols bfloat16 N(0, 0.02) draws, a linear layer's weight scale,
// with every 64th row scaled by 8 so that the block amax spans several e4m3 binades.
// Built once, untimed.
const std::string& Nvfp4Buffer() {
  static std::string* data = [] {
    const int64_t n = kNvfp4Rows * kNvfp4Cols;
    auto* bytes = new std::string(n * 2, '\0');
    std::mt19937 rng(kNvfp4Seed);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng) * ((i / kNvfp4Cols) % 64 == 0 ? 8.0f : 1.0f);
      const uint16_t b = FloatToBFloat16(v);
      std::memcpy(&(*bytes)[2 * i], &b, 2);
    }
    return bytes;
  }();
  return *data;
}

TensorView Nvfp4Tensor() {
  return TensorView::Create(DType::kBFloat16, {kNvfp4Rows, kNvfp4Cols}, Nvfp4Buffer()).value();
}

// The dynamic calculator of an NVFP4 weight spec (per_block 16 on the last axis,
// float8_e4m3fn block scales), as the service's Compute builds it.
std::unique_ptr<QParamsCalculatorBase> Nvfp4Calculator(Nvfp4Convention convention) {
  QuantSpec spec;
  spec.dtype = "float4_e2m1fn_x2";
  spec.granularity = Granularity::PerBlock(-1, 16);
  spec.scale_dtype = std::string(kE4M3ScaleDType);
  spec.convention = std::string(Nvfp4ConventionName(convention));
  return QParamsCalculatorRegistry::Global().Create("dynamic", spec).value();
}

// As BM_ObserveRange: the read-and-sum and one forward of the dynamic calculator
// (the range pass, the global scale from the tensor's amax and the block codes) in
// alternation within each iteration; the reported time is the forward's.
void BM_Nvfp4Scales(benchmark::State& state, Nvfp4Convention convention) {
  const std::string& data = Nvfp4Buffer();
  const Observation x = Observation::FromTensor(Nvfp4Tensor());
  std::unique_ptr<QParamsCalculatorBase> calculator = Nvfp4Calculator(convention);
  double baseline_seconds = 0, scales_seconds = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(ReadAndSum(data));
    baseline_seconds += Seconds(start);
    start = std::chrono::steady_clock::now();
    absl::StatusOr<QParams> q = calculator->Forward(x);
    const double seconds = Seconds(start);
    if (!q.ok()) state.SkipWithError(std::string(q.status().message()).c_str());
    benchmark::DoNotOptimize(q);
    scales_seconds += seconds;
    state.SetIterationTime(seconds);
  }
  const double bytes = static_cast<double>(state.iterations()) * data.size();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["baseline_GBps"] = bytes / baseline_seconds / 1e9;
  state.counters["ratio"] = baseline_seconds / scales_seconds;
}

// ---------------------------------------------------------------- histograms

constexpr int kBinningBins = 4096;  // histogram.md's default num_bins, as ModelOpt's histc

// Seeds and the outliers of the histogram data, so that histogram_bench.py can say
// what it reads (it reads the very bytes, written by --histogram_data).
constexpr uint32_t kHistogramSeed = 2024;
constexpr int kBinningOutliers = 16;  // ±(20 .. 35)σ, spread over the tensor

// The binning benchmark's tensor: kRows x kCols (256 MiB) float32 N(0, 1) draws with
// kBinningOutliers outliers at evenly spread positions. Built once, untimed.
const std::string& HistogramBuffer() {
  static std::string* data = [] {
    const int64_t n = kRows * kCols;
    auto* bytes = new std::string(n * 4, '\0');
    std::mt19937 rng(kHistogramSeed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      std::memcpy(&(*bytes)[4 * i], &v, 4);
    }
    for (int o = 0; o < kBinningOutliers; ++o) {
      const float v = (o % 2 ? -1.0f : 1.0f) * (20.0f + o);
      std::memcpy(&(*bytes)[4 * (n / kBinningOutliers * o + 12345)], &v, 4);
    }
    return bytes;
  }();
  return *data;
}

TensorView HistogramTensor() {
  return TensorView::Create(DType::kFloat32, {kRows, kCols}, HistogramBuffer()).value();
}

// As BM_ObserveRange: the read-and-sum and BinTensor in alternation within each
// iteration; the reported time is BinTensor's.
void BM_BinTensor(benchmark::State& state) {
  const std::string& data = HistogramBuffer();
  const TensorView x = HistogramTensor();
  double baseline_seconds = 0, bin_seconds = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(ReadAndSum(data));
    baseline_seconds += Seconds(start);
    start = std::chrono::steady_clock::now();
    absl::StatusOr<Histogram> h = BinTensor(x, kBinningBins, NonFinitePolicy::kReject);
    const double seconds = Seconds(start);
    if (!h.ok()) state.SkipWithError(std::string(h.status().message()).c_str());
    benchmark::DoNotOptimize(h);
    bin_seconds += seconds;
    state.SetIterationTime(seconds);
  }
  const double bytes = static_cast<double>(state.iterations()) * data.size();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["baseline_GBps"] = bytes / baseline_seconds / 1e9;
  state.counters["ratio"] = baseline_seconds / bin_seconds;
}

// The searches' histogram: 2^20 N(0, 1) float32 samples and kSearchOutliers outliers
// up to 7.9σ, so that the occupied bins M are near num_bins (7.9 = 0.9875·8: M is
// 98.75% of num_bins) and the bins up to about 4.5σ are all non-empty: close to the
// worst case of the search's cost.
constexpr int64_t kSearchSamples = int64_t{1} << 20;
constexpr float kSearchOutliers[] = {6.0f, -6.5f, 7.0f, -7.5f, 7.9f};

const Histogram& SearchHistogram(int num_bins) {
  static auto* histograms = new std::map<int, Histogram>();
  auto it = histograms->find(num_bins);
  if (it != histograms->end()) return it->second;
  std::mt19937 rng(kHistogramSeed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(kSearchSamples);
  for (float& v : values) v = normal(rng);
  for (float v : kSearchOutliers) values.push_back(v);
  const absl::string_view bytes(reinterpret_cast<const char*>(values.data()), 4 * values.size());
  const TensorView x =
      TensorView::Create(DType::kFloat32, {static_cast<int64_t>(values.size())}, bytes).value();
  return (*histograms)[num_bins] = BinTensor(x, num_bins, NonFinitePolicy::kReject).value();
}

enum class Search { kEntropy, kMse };

// One search of histogram.md §6 at start_bin 128, stride 1, for int8 symmetric (the
// service's defaults: 128 levels; mse on the grid [-128, 127]), on `threads` OpenMP
// threads (SetRangeThreads; 1 is qparams-server's default --omp_threads).
void BM_Search(benchmark::State& state, Search search, int num_bins, int threads) {
  const Histogram& h = SearchHistogram(num_bins);
  const SearchGrid grid{128, 1};
  SetRangeThreads(threads);
  CalibrationResult result;
  for (auto _ : state) {
    result = search == Search::kEntropy
                 ? EntropyCalibration(h, grid, /*skip_zeros=*/false, /*levels=*/128)
                 : MseCalibration(h, grid, /*skip_zeros=*/false, QParamsRecipe(),
                                  /*nonnegative=*/false);
    benchmark::DoNotOptimize(result);
  }
  SetRangeThreads(0);
  state.counters["M"] = static_cast<double>(h.occupied_bins());
  int64_t nonzero = 0;
  for (uint64_t c : h.counts) nonzero += c != 0;
  state.counters["nonzero_bins"] = static_cast<double>(nonzero);
  state.counters["amax"] = result.amax;
  state.counters["bin_index"] = static_cast<double>(result.bin_index);
}

struct SearchCase {
  const char* method;
  Search search;
  int num_bins;
  int threads;
  double target_ms;  // 0: information
};

// Thread counts: the machine's (OpenMP's default) and 1 (qparams-server's default).
const std::vector<SearchCase>& SearchCases() {
  static const auto* cases = [] {
    auto* v = new std::vector<SearchCase>();
    const int cores = omp_get_max_threads();
    for (int threads : {cores, 1}) {
      v->push_back({"entropy", Search::kEntropy, 4096, threads, 100});
      v->push_back({"mse", Search::kMse, 4096, threads, 0});
      v->push_back({"entropy", Search::kEntropy, 16384, threads, 0});
      if (cores == 1) break;
    }
    return v;
  }();
  return *cases;
}

std::string SearchName(const SearchCase& c) {
  return absl::StrFormat("search/%s/bins:%d/threads:%d", c.method, c.num_bins, c.threads);
}

// --histogram_data: the tensor's bytes to `path`, and the core's histogram of it to
// `path`.json ({"num_bins", "exponent", "counts", "zero_count", "negative_count",
// "min", "max"}).
bool WriteHistogramData(const std::string& path) {
  const std::string& data = HistogramBuffer();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  const Histogram h = BinTensor(HistogramTensor(), kBinningBins, NonFinitePolicy::kReject).value();
  std::ofstream json(path + ".json", std::ios::trunc);
  json << absl::StrFormat(
      "{\"num_bins\": %d, \"exponent\": %d, \"zero_count\": %d, \"negative_count\": %d, "
      "\"min\": %.17g, \"max\": %.17g, \"elements\": %d, \"seed\": %d, \"outliers\": %d, "
      "\"counts\": [%s]}\n",
      h.num_bins, h.exponent, h.zero_count, h.negative_count, *h.min, *h.max, kRows * kCols,
      kHistogramSeed, kBinningOutliers, absl::StrJoin(h.counts, ", "));
  out.close();
  json.close();
  return out.good() && json.good();
}

struct Nvfp4Case {
  Nvfp4Convention convention;
  double target;  // share of the read-and-sum bandwidth
};

const std::vector<Nvfp4Case>& Nvfp4Cases() {
  static const auto* cases = new std::vector<Nvfp4Case>{
      {Nvfp4Convention::kCompressedTensors, 0.50},
      {Nvfp4Convention::kModelOpt, 0.50},
  };
  return *cases;
}

std::string Nvfp4Name(Nvfp4Convention convention) {
  return absl::StrFormat("nvfp4_scales/bfloat16/%s", Nvfp4ConventionName(convention));
}

// --nvfp4_data: the weight's bytes (raw little-endian bfloat16) to `path`, each
// convention's block codes (one byte a block, row-major) to `path`.CONVENTION.e4m3, and
// `path`.json with the shape, seed, and each convention's global scale and amax (as
// float32 bit patterns and values).
bool WriteNvfp4Data(const std::string& path) {
  const std::string& data = Nvfp4Buffer();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  bool ok = out.good();
  std::vector<std::string> json = {
      absl::StrFormat("\"rows\": %d, \"cols\": %d, \"block_size\": %d, \"seed\": %d",
                      kNvfp4Rows, kNvfp4Cols, kNvfp4BlockSize, kNvfp4Seed)};
  for (const Nvfp4Case& c : Nvfp4Cases()) {
    const QParams q = Nvfp4Calculator(c.convention)->Forward(Observation::FromTensor(Nvfp4Tensor())).value();
    const std::string name(Nvfp4ConventionName(c.convention));
    std::ofstream codes(path + "." + name + ".e4m3", std::ios::binary | std::ios::trunc);
    codes.write(reinterpret_cast<const char*>(q.scale_e4m3.data()),
                static_cast<std::streamsize>(q.scale_e4m3.size()));
    codes.close();
    ok &= codes.good();
    json.push_back(absl::StrFormat(
        "\"%s\": {\"global_scale\": %.9g, \"global_scale_bits\": %u, \"amax\": %.9g, "
        "\"amax_bits\": %u}",
        name, *q.global_scale, FloatBits(*q.global_scale), *q.amax, FloatBits(*q.amax)));
  }
  std::ofstream meta(path + ".json", std::ios::trunc);
  meta << "{" << absl::StrJoin(json, ", ") << "}\n";
  meta.close();
  return ok && meta.good();
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

// Keeps each run's counters (bytes/s among them) and real time for the summary.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      for (const auto& [name, counter] : run.counters) {
        counters[run.benchmark_name()][name] = counter.value;
      }
      // In the benchmark's unit (milliseconds here).
      counters[run.benchmark_name()]["real_time"] = run.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, std::map<std::string, double>> counters;
};

std::string Name(const std::string& what, DType dtype) {
  return absl::StrFormat("%s/%s", what, DTypeName(dtype));
}

// The counters of `name`'s median over its repetitions (run names carry the options
// after the name), or of its single run; null if it did not run (filtered out).
std::map<std::string, double>* Median(CapturingReporter& reporter, const std::string& name) {
  const std::string prefix = name + "/";
  std::map<std::string, double>* single = nullptr;
  for (auto it = reporter.counters.lower_bound(name); it != reporter.counters.end(); ++it) {
    if (it->first != name && it->first.compare(0, prefix.size(), prefix) != 0) break;
    if (absl::EndsWith(it->first, "_median")) return &it->second;
    if (!absl::EndsWith(it->first, "_mean") && !absl::EndsWith(it->first, "_stddev") &&
        !absl::EndsWith(it->first, "_cv")) {
      single = &it->second;
    }
  }
  return single;
}

// Takes --NAME=VALUE out of argv (Google Benchmark refuses flags it does not know).
std::string TakeFlag(int* argc, char** argv, const std::string& name) {
  const std::string prefix = "--" + name + "=";
  std::string value;
  int kept = 0;
  for (int i = 0; i < *argc; ++i) {
    if (i > 0 && absl::StartsWith(argv[i], prefix)) {
      value = argv[i] + prefix.size();
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  return value;
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
  for (const Nvfp4Case& c : Nvfp4Cases()) {
    benchmark::RegisterBenchmark(Nvfp4Name(c.convention).c_str(), BM_Nvfp4Scales, c.convention)
        ->UseManualTime()
        ->MinTime(1.0)
        ->Repetitions(5)
        ->ReportAggregatesOnly(true)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("bin_tensor/float32/bins:4096", BM_BinTensor)
      ->UseManualTime()
      ->MinTime(1.0)
      ->Repetitions(5)
      ->ReportAggregatesOnly(true)
      ->Unit(benchmark::kMillisecond);
  for (const SearchCase& c : SearchCases()) {
    benchmark::RegisterBenchmark(SearchName(c).c_str(), BM_Search, c.search, c.num_bins,
                                 c.threads)
        ->UseRealTime()
        ->MinTime(0.5)
        ->Repetitions(3)
        ->ReportAggregatesOnly(true)
        ->Unit(benchmark::kMillisecond);
  }
  const std::string histogram_data = TakeFlag(&argc, argv, "histogram_data");
  const std::string nvfp4_data = TakeFlag(&argc, argv, "nvfp4_data");
  const std::string json_path = TakeFlag(&argc, argv, "json");
  if (!histogram_data.empty() && !WriteHistogramData(histogram_data)) {
    std::cerr << "core_bench: cannot write " << histogram_data << "\n";
    return 1;
  }
  if (!nvfp4_data.empty() && !WriteNvfp4Data(nvfp4_data)) {
    std::cerr << "core_bench: cannot write " << nvfp4_data << "\n";
    return 1;
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
  std::vector<std::string> json = {absl::StrFormat("\"threads\": %d", omp_get_max_threads())};
  if (std::map<std::string, double>* c = Median(reporter, "bin_tensor/float32/bins:4096")) {
    const double target = 0.25;
    const bool met = (*c)["ratio"] >= target;
    all_met &= met;
    std::cout << "\nBinning |x| into a histogram (BinTensor, " << kBinningBins
              << " bins: the scan for amax, then the bins;\nhistogram.md §2.3) vs. the same "
              << "read-and-sum, timed in alternation; medians of 5\nrepetitions (" << kRows
              << " x " << kCols << " float32 N(0, 1), " << kBinningOutliers << " outliers, "
              << omp_get_max_threads() << " threads)\n\n"
              << "| tensor | GB/s | baseline GB/s | ratio | target |\n"
              << "|---|---|---|---|---|\n"
              << absl::StrFormat("| float32 %d x %d (256 MiB) | %.2f | %.2f | %.0f%% | >= %.0f%% %s |\n",
                                 kRows, kCols, (*c)["bytes_per_second"] / 1e9,
                                 (*c)["baseline_GBps"], 100 * (*c)["ratio"], 100 * target,
                                 met ? "met" : "MISSED");
    json.push_back(absl::StrFormat("\"bin_gbps\": %.3f", (*c)["bytes_per_second"] / 1e9));
    json.push_back(absl::StrFormat("\"bin_baseline_gbps\": %.3f", (*c)["baseline_GBps"]));
    json.push_back(absl::StrFormat("\"bin_ratio\": %.4f", (*c)["ratio"]));
  }
  bool nvfp4 = false;
  for (const Nvfp4Case& nc : Nvfp4Cases()) {
    std::map<std::string, double>* c = Median(reporter, Nvfp4Name(nc.convention));
    if (c == nullptr) continue;
    if (!nvfp4) {
      nvfp4 = true;
      std::cout << "\nNVFP4 block scales of a weight (the dynamic calculator's forward: the "
                   "range pass in\nblocks of 16 along the last axis, the global scale from "
                   "the tensor's amax, the float8_e4m3fn\nblock codes; nvfp4.md §3) vs. the "
                   "same read-and-sum of the same buffer, timed in alternation;\nmedians of 5 "
                   "repetitions ("
                << kNvfp4Rows << " x " << kNvfp4Cols << " bfloat16, " << omp_get_max_threads()
                << " threads)\n\n"
                << "| convention | GB/s | baseline GB/s | ratio | ms | target |\n"
                << "|---|---|---|---|---|---|\n";
    }
    const bool met = (*c)["ratio"] >= nc.target;
    all_met &= met;
    const std::string name(Nvfp4ConventionName(nc.convention));
    std::cout << absl::StrFormat("| %s | %.2f | %.2f | %.0f%% | %.2f | >= %.0f%% %s |\n", name,
                                 (*c)["bytes_per_second"] / 1e9, (*c)["baseline_GBps"],
                                 100 * (*c)["ratio"], (*c)["real_time"], 100 * nc.target,
                                 met ? "met" : "MISSED");
    json.push_back(
        absl::StrFormat("\"nvfp4_%s_gbps\": %.3f", name, (*c)["bytes_per_second"] / 1e9));
    json.push_back(
        absl::StrFormat("\"nvfp4_%s_baseline_gbps\": %.3f", name, (*c)["baseline_GBps"]));
    json.push_back(absl::StrFormat("\"nvfp4_%s_ratio\": %.4f", name, (*c)["ratio"]));
    json.push_back(absl::StrFormat("\"nvfp4_%s_ms\": %.3f", name, (*c)["real_time"]));
  }
  bool searches = false;
  for (const SearchCase& sc : SearchCases()) {
    std::map<std::string, double>* c = Median(reporter, SearchName(sc));
    if (c == nullptr) continue;
    if (!searches) {
      searches = true;
      std::cout << "\nThe searches (histogram.md §6; start_bin 128, stride 1, int8 symmetric) on "
                   "a histogram of 2^20\nN(0, 1) float32 samples and "
                << std::size(kSearchOutliers)
                << " outliers up to 7.9: milliseconds per search, medians of 3 repetitions\n\n"
                << "| search | num_bins | occupied bins M (non-empty) | OpenMP threads | ms | "
                   "amax | target |\n"
                << "|---|---|---|---|---|---|---|\n";
    }
    const double ms = (*c)["real_time"];
    std::string target = "(information)";
    if (sc.target_ms > 0) {
      const bool met = ms < sc.target_ms;
      all_met &= met;
      target = absl::StrFormat("< %.0f ms %s", sc.target_ms, met ? "met" : "MISSED");
    }
    std::cout << absl::StrFormat("| %s | %d | %.0f (%.0f) | %d | %.1f | %.9g | %s |\n", sc.method,
                                 sc.num_bins, (*c)["M"], (*c)["nonzero_bins"], sc.threads, ms,
                                 (*c)["amax"], target);
    json.push_back(absl::StrFormat("\"search_%s_%d_t%d_ms\": %.2f", sc.method, sc.num_bins,
                                   sc.threads, ms));
  }
  std::cout << "\n" << (all_met ? "all targets met" : "some targets missed") << "\n";
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::trunc);
    out << "{" << absl::StrJoin(json, ", ") << "}\n";
  }
  benchmark::Shutdown();
  return 0;
}
