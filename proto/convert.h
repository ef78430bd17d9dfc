// Conversions between the wire messages of qparams.v1 and the core's values, shared
// by the server (requests in, results out) and the client (tensors out, local
// reductions); those of the values the wire shares with the storage format are
// types/codec.h's, named here too. Parsing checks only what the wire form adds (enum
// values, oneofs); the core checks the rest. Errors are INVALID_ARGUMENT naming the
// field.

#ifndef QPARAMS_PROTO_CONVERT_H_
#define QPARAMS_PROTO_CONVERT_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dedupe_window.h"
#include "core/calibration.h"
#include "core/dtype.h"
#include "core/granularity.h"
#include "core/histogram.h"
#include "core/histogram_params.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/quant_spec.h"
#include "core/scale_group.h"
#include "core/step_merge.h"
#include "core/tensor.h"
#include "qparams/v1/qparams.pb.h"
#include "types/codec.h"

namespace qparams::wire {

// The most observations one ObserveBatch takes (the contract's limit, for the
// server that enforces it and the clients that split their batches by it): a batch
// this long is milliseconds of work, and its responses stay far below any message
// limit.
inline constexpr int kMaxBatchObservations = 4096;

// The trailing metadata that names the replica owning a session a call was refused
// for (FAILED_PRECONDITION on a sharded server, docs/sharding.md).
inline constexpr char kOwnerMetadata[] = "x-qparams-owner";

// The core values the wire shares with the storage format (qparams/v1/types.proto)
// convert as on disk, by the one codec (types/codec.h): DType, Granularity, Target,
// QuantSpec (the spec as sent; an unknown enum value is INVALID_ARGUMENT naming
// spec.qscheme or spec.target) and HistogramParams (as sent: an unknown nonfinite is
// INVALID_ARGUMENT naming histogram.nonfinite).
using types::DTypeFromProto;
using types::DTypeToProto;
using types::GranularityFromProto;
using types::GranularityToProto;
using types::HistogramParamsFromProto;
using types::HistogramParamsToProto;
using types::SpecFromProto;
using types::SpecToProto;
using types::TargetFromProto;
using types::TargetToProto;

// A view of a wire tensor's bytes (no copy): `tensor` must outlive it. Malformed
// tensors are INVALID_ARGUMENT, more than `max_elements` is RESOURCE_EXHAUSTED.
absl::StatusOr<TensorView> TensorFromProto(const v1::Tensor& tensor, int64_t max_elements,
                                           absl::string_view field);
// The wire form of a tensor (copies its bytes once).
v1::Tensor TensorToProto(const TensorView& tensor);

// qparams (buffers or a forward's result) on the wire, and back. The NVFP4 fields
// (scale_e4m3, global_scale, amax) are set on the wire only when the core's are, and
// read back as sent. NVFP4 block scales: the wire's `scale` holds the codes' values
// (ScaleValues), which the core does not keep; reading back drops them.
v1::QParams QParamsToProto(const QParams& qparams);
QParams QParamsFromProto(const v1::QParams& qparams);

// Scale groups (nvfp4.md §4): SHARE_UNSPECIFIED (or an unknown value) is unset, for
// the engine to refuse naming the field.
std::optional<GroupShare> GroupShareFromProto(v1::ScaleGroup::Share share);
v1::ScaleGroup::Share GroupShareToProto(GroupShare share);
v1::GroupQParams GroupResultToProto(absl::string_view group, const GroupResult& result);
GroupResult GroupResultFromProto(const v1::GroupQParams& result);

// A histogram as sent (a copy; the calculator checks it, ValidateHistogram) and a
// session's on the wire (GetHistogram).
Histogram HistogramFromProto(const v1::HistogramObservation& histogram);
v1::HistogramObservation HistogramToProto(const Histogram& histogram);

// The search's result beside a histogram session's qparams, and back.
v1::CalibrationResult CalibrationToProto(const CalibrationResult& calibration);
CalibrationResult CalibrationFromProto(const v1::CalibrationResult& calibration);

// The observation of a request: its tensor, its range (min/max views and the input
// shape), or its histogram (copied, and held by the observation). Views point into
// `request`, which must outlive the result. None set is INVALID_ARGUMENT.
absl::StatusOr<Observation> ObservationFromProto(const v1::ObserveRequest& request,
                                                 int64_t max_elements);

// The idempotency key of a request; nullopt when neither client_id nor sequence is
// set. Not validated here: the engine refuses a bad key (ValidateObserveKey).
std::optional<ObserveKey> ObserveKeyFromProto(const v1::ObserveRequest& request);

// The observation of a Compute request: exactly one of its tensor and its range, as
// ObservationFromProto; both or neither set is INVALID_ARGUMENT.
absl::StatusOr<Observation> ComputeObservationFromProto(const v1::ComputeRequest& request,
                                                        int64_t max_elements);

// A step contribution's observation: its tensor, its range, or unset ("nothing": the
// rank did not run the module). Views point into `contribution`.
absl::StatusOr<std::optional<Observation>> ContributionFromProto(
    const v1::StepContribution& contribution, int64_t max_elements);

// A step-merged session's progress: its open steps' missing ranks and the steps
// closed incomplete.
v1::StepProgress StepProgressToProto(const StepState& steps);

}  // namespace qparams::wire

#endif  // QPARAMS_PROTO_CONVERT_H_
