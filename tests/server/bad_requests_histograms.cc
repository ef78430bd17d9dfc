// The bad requests of histogram sessions (histogram.md): their parameters, the
// histograms observed, GetHistogram.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/server/bad_request_table.h"

namespace qparams::testing::bad_request {

std::vector<Row> HistogramRows() {
  Table table;

  // ---- Histogram sessions (histogram.md §3.2, §4, §9) ----
  auto hist_create = [&](std::string what, const std::string& calc, v1::HistogramParams params,
                         std::string field, const v1::QuantSpec& spec = Spec()) {
    table.Add(std::move(what), Method::kCreateSession, CreateHistReq(calc, spec, params), kInvalid,
              std::move(field));
  };
  hist_create("num_bins 3000 (not a power of two)", "percentile",
              Params([](auto& p) { p.set_num_bins(3000); }), "histogram.num_bins");
  hist_create("num_bins 128", "mse", Params([](auto& p) { p.set_num_bins(128); }),
              "histogram.num_bins");
  hist_create("num_bins 131072", "entropy", Params([](auto& p) { p.set_num_bins(131072); }),
              "histogram.num_bins");
  hist_create("percentile 0", "percentile", Params([](auto& p) { p.set_percentile(0); }),
              "histogram.percentile");
  hist_create("percentile above 100", "percentile",
              Params([](auto& p) { p.set_percentile(100.00000000000001); }),
              "histogram.percentile");
  hist_create("percentile NaN", "percentile", Params([](auto& p) { p.set_percentile(kNaN); }),
              "histogram.percentile");
  hist_create("start_bin 0", "entropy", Params([](auto& p) { p.set_start_bin(0); }),
              "histogram.start_bin");
  hist_create("start_bin above num_bins", "mse", Params([](auto& p) {
                p.set_num_bins(256);
                p.set_start_bin(257);
              }),
              "histogram.start_bin");
  hist_create("stride 0", "mse", Params([](auto& p) { p.set_stride(0); }), "histogram.stride");
  hist_create("percentile on entropy", "entropy", Params([](auto& p) { p.set_percentile(99); }),
              "histogram.percentile");
  hist_create("stride on percentile", "percentile", Params([](auto& p) { p.set_stride(2); }),
              "histogram.stride");
  hist_create("nonfinite unknown enum 7", "percentile",
              Params([](auto& p) { p.set_nonfinite(static_cast<v1::NonFinitePolicy>(7)); }),
              "histogram.nonfinite");
  hist_create("histogram (empty) on static", "static", v1::HistogramParams(), "histogram");
  hist_create("histogram on moving_average", "moving_average",
              Params([](auto& p) { p.set_num_bins(256); }), "histogram");
  hist_create("entropy with float8_e4m3fn", "entropy", v1::HistogramParams(), "spec.dtype",
              Spec("float8_e4m3fn"));
  hist_create("mse with float4_e2m1fn_x2", "mse", v1::HistogramParams(), "spec.dtype",
              Spec("float4_e2m1fn_x2"));
  hist_create("percentile per_channel", "percentile", v1::HistogramParams(), "spec.granularity",
              Spec("int8", v1::SYMMETRIC, PerChannel(0)));
  hist_create("mse with a float_range bound", "mse", v1::HistogramParams(), "spec.float_range",
              WithFloatRange(Spec(), -1.0, std::nullopt));
  table.Compute("percentile on Compute", Good(), kInvalid, "CreateSession", Spec(), "percentile");
  table.Compute("entropy on Compute", Good(), kInvalid, "CreateSession", Spec(), "entropy");
  // Histogram observations breaking a rule of §3.2, on the initialized percentile session.
  table.Observe("hist: num_bins 512 (the session's is 256)",
                HistReq(kHist, [](auto& f) { f.num_bins = 512; }), kInvalid, "histogram.num_bins");
  table.Observe("hist: num_bins 0", HistReq(kHist, [](auto& f) { f.num_bins = 0; }), kInvalid,
                "histogram.num_bins");
  table.Observe("hist: 257 counts", HistReq(kHist, [](auto& f) { f.counts.resize(257); }), kInvalid,
                "histogram.counts");
  table.Observe("hist: counts summing past 2^64 (two of 2^63)",
                HistReq(kHist,
                        [](auto& f) {
                          f.counts[0] = uint64_t{1} << 63;
                          f.counts[128] = uint64_t{1} << 63;
                        }),
                kInvalid, "2^62");
  table.Observe("hist: nan_count under nonfinite=reject",
                HistReq(kHist, [](auto& f) { f.nan_count = 1; }), kInvalid, "histogram.nan_count");
  table.Observe("hist: no value at all",
                HistReq(kHist,
                        [](auto& f) {
                          f.counts.clear();
                          f.min.reset();
                          f.max.reset();
                          f.exponent = -126;
                        }),
                kInvalid, "rule 5");
  table.Observe("hist: min without max", HistReq(kHist, [](auto& f) { f.max.reset(); }), kInvalid,
                "histogram.min");
  table.Observe("hist: no extrema but counts",
                HistReq(kHist,
                        [](auto& f) {
                          f.min.reset();
                          f.max.reset();
                        }),
                kInvalid, "rule 7");
  table.Observe("hist: min > max", HistReq(kHist, [](auto& f) { f.min = 1.5; }), kInvalid,
                "exceeds max");
  table.Observe("hist: max +Inf", HistReq(kHist, [](auto& f) { f.max = kInf; }), kInvalid,
                "histogram.min");
  table.Observe("hist: exponent -8 for amax 1.0", HistReq(kHist, [](auto& f) { f.exponent = -8; }),
                kInvalid, "histogram.exponent");
  table.Observe("hist: the bin of amax empty",
                HistReq(kHist,
                        [](auto& f) {
                          f.counts[128] = 0;
                          f.counts[3] = 1;
                        }),
                kInvalid, "histogram.counts[128]");
  table.Observe("hist: a count after the bin of amax",
                HistReq(kHist, [](auto& f) { f.counts.push_back(1); }), kInvalid,
                "histogram.counts[129]");
  table.Observe("hist: zero_count above counts[0]",
                HistReq(kHist, [](auto& f) { f.zero_count = 1; }), kInvalid,
                "histogram.zero_count");
  table.Observe("hist: negative_count with min >= 0",
                HistReq(kHist, [](auto& f) { f.negative_count = 1; }), kInvalid,
                "histogram.negative_count");
  table.Observe("hist: min < 0 without negative_count",
                HistReq(kHist, [](auto& f) { f.min = -0.5; }), kInvalid,
                "histogram.negative_count");
  // Tensors and ranges on a histogram session, histograms on the others.
  table.Observe("hist: NaN in a tensor under nonfinite=reject",
                ObserveTensorReq(kHist, F32({3}, {1, kNaN, 2})), kInvalid, "nonfinite=reject");
  table.Observe("hist: zero-size tensor [0]",
                ObserveTensorReq(kHist, RawTensor(v1::FLOAT32, {0}, "")), kInvalid, "tensor.shape");
  table.Observe("hist: data one byte short",
                ObserveTensorReq(kHist, RawTensor(v1::FLOAT32, {2}, std::string(7, '\0'))),
                kInvalid, "tensor.data");
  table.Observe("hist: float64 value of 2^128",
                ObserveTensorReq(kHist, T(v1::FLOAT64, {2}, {1, 0x1p128})), kInvalid, "2^128");
  table.Observe("hist: a range observation",
                ObserveRangeReq(kHist, {2}, F32({1}, {-1}), F32({1}, {1})), kInvalid,
                "RangeObservation");
  table.Observe("static: a histogram observation", ObserveHistReq(kStatic, {}), kInvalid,
                "HistogramObservation");
  table.Observe("ma: a histogram observation", ObserveHistReq(kMovingAvg, {}), kInvalid,
                "HistogramObservation");
  // The 2^62 limit (§5.4): valid observations that the session cannot take.
  table.Observe("full: a histogram of 5 more values",
                HistReq(kHistFull, [](auto& f) { f.counts[128] = 5; }), kExhausted, "2^62");
  table.Observe("full: a tensor of 6 more values",
                ObserveTensorReq(kHistFull, F32({6}, {1, 1, 1, 1, 1, 1})), kExhausted, "2^62");
  table.Stream("stream: histogram of 512 bins on the hist session",
               HistReq(kHist, [](auto& f) { f.num_bins = 512; }), kInvalid, "histogram.num_bins");
  table.Stream("stream: histogram on the static session", ObserveHistReq(kStatic, {}), kInvalid,
               "HistogramObservation");
  table.Stream("stream: 5 more values at the limit",
               HistReq(kHistFull, [](auto& f) { f.counts[128] = 5; }), kExhausted, "2^62");
  table.Add("GetHistogram of a static session", Method::kGetHistogram,
            Named<v1::GetHistogramRequest>(kStatic), kInvalid, "percentile, entropy and mse");
  table.Add("GetHistogram of a moving_average session", Method::kGetHistogram,
            Named<v1::GetHistogramRequest>(kMovingAvg), kInvalid, "moving_average");
  table.Add("GetHistogram name with a space", Method::kGetHistogram,
            Named<v1::GetHistogramRequest>("hard/a b"), kInvalid, "name");
  table.Add("GetHistogram unknown", Method::kGetHistogram,
            Named<v1::GetHistogramRequest>("hard/missing"), kNotFound, "hard/missing");
  return table.TakeRows();
}

}  // namespace qparams::testing::bad_request
