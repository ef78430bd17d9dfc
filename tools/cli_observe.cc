// observe: one forward of a session per .npy file, all over one stream; with
// --reduce-locally each file reduced here to what the session needs.

#include <optional>
#include <string>
#include <vector>

#include "core/granularity.h"
#include "core/histogram.h"
#include "core/histogram_params.h"
#include "core/range.h"
#include "proto/convert.h"
#include "tools/cli_internal.h"
#include "tools/npy.h"

namespace qparams::cli {
namespace {

// The observation of `tensor` reduced to its block minima and maxima under the
// session's granularity. A tensor that cannot be reduced (the granularity does not
// fit it, non-finite values, no elements) is sent whole instead: the server then
// judges it by the same rules as any other (export mode, for one, reads no values)
// and answers in its response.
v1::ObserveRequest ReducedObservation(const std::string& name, const TensorView& tensor,
                                      const Granularity& granularity, Target target) {
  absl::StatusOr<Shape> block = granularity.BlockShape(tensor.shape(), target);
  if (!block.ok()) return TensorObservation(name, tensor);
  absl::StatusOr<BlockRange> range = ObserveRange(tensor, *block);
  if (!range.ok()) return TensorObservation(name, tensor);
  return RangeObservation(name, tensor.shape(), range->min.view(), range->max.view());
}

// The observation of `tensor` binned here into a histogram session's histogram.
// A tensor that cannot be binned (non-finite values under nonfinite=reject, no
// elements) is sent whole, as ReducedObservation does.
v1::ObserveRequest BinnedObservation(const std::string& name, const TensorView& tensor,
                                     const HistogramParams& params) {
  absl::StatusOr<Histogram> histogram = BinTensor(
      tensor, params.num_bins.value_or(HistogramParams::kDefaultNumBins), params.nonfinite);
  if (!histogram.ok()) return TensorObservation(name, tensor);
  return HistogramObservation(name, *histogram);
}

}  // namespace

int Observe(Invocation& in) {
  const std::string& name = in.arg(0);
  std::optional<Granularity> granularity;
  std::optional<HistogramParams> histogram;  // a histogram session's, with --reduce-locally
  Target target = Target::kWeight;
  if (in.options().reduce_locally) {
    absl::StatusOr<v1::Session> session = in.client().GetSession(name);
    if (!session.ok()) return in.Fail(session.status());
    if (session->has_histogram()) {
      absl::StatusOr<HistogramParams> params = wire::HistogramParamsFromProto(session->histogram());
      if (!params.ok()) return in.Fail(params.status());
      histogram = *std::move(params);
    } else {
      absl::StatusOr<Granularity> g =
          wire::GranularityFromProto(session->spec().granularity(), "session.spec.granularity");
      if (!g.ok()) return in.Fail(g.status());
      granularity = *std::move(g);
      target = wire::TargetFromProto(session->spec().target());
    }
  }

  // Each file becomes its request at once, so that only one file's tensor is held
  // twice at a time.
  std::vector<v1::ObserveRequest> requests;
  for (size_t i = 1; i < in.arg_count(); ++i) {
    absl::StatusOr<Tensor> tensor = ReadNpy(in.arg(i), in.dtype());
    if (!tensor.ok()) return in.Fail(tensor.status());
    requests.push_back(histogram.has_value() ? BinnedObservation(name, tensor->view(), *histogram)
                       : granularity.has_value()
                           ? ReducedObservation(name, tensor->view(), *granularity, target)
                           : TensorObservation(name, tensor->view()));
  }

  absl::StatusOr<std::vector<v1::ObserveResponse>> responses = in.client().ObserveStream(requests);
  if (!responses.ok()) return in.Fail(responses.status());
  int exit = kExitOk;
  for (size_t i = 0; i < responses->size(); ++i) {
    const v1::ObserveResponse& response = (*responses)[i];
    const std::string& file = in.arg(i + 1);
    if (in.table()) in.out() << file << ": ";
    in.Print(response);
    if (response.status().code() != 0) {
      in.err() << "error: " << CodeName(response.status()) << ": " << file << ": "
               << response.status().message() << "\n";
      exit = kExitFailed;
    }
  }
  return exit;
}

}  // namespace qparams::cli
