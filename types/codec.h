// The one conversion of the core values shared by the wire contract and the storage
// format (qparams/v1/types.proto) between their messages and the core's: the wire
// conversion (proto/convert.h) and the storage codecs (storage/session_codec.h)
// both call it, so a value is converted the same way on the wire and on disk.
// Parsing checks only what the message form adds (enum values, oneofs); the core
// checks the rest. Errors are INVALID_ARGUMENT naming the field. Stateless; safe
// from any thread.

#ifndef QPARAMS_TYPES_CODEC_H_
#define QPARAMS_TYPES_CODEC_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/granularity.h"
#include "core/histogram_params.h"
#include "core/quant_spec.h"
#include "qparams/v1/types.pb.h"

namespace qparams::types {

// DType <-> qparams.v1.DType. DTYPE_UNSPECIFIED and unknown values are
// INVALID_ARGUMENT naming `field`.
absl::StatusOr<DType> DTypeFromProto(int dtype, absl::string_view field);
v1::DType DTypeToProto(DType dtype);

// The granularity of a spec; an unset oneof is per_tensor.
absl::StatusOr<Granularity> GranularityFromProto(const v1::Granularity& granularity,
                                                 absl::string_view field);
v1::Granularity GranularityToProto(const Granularity& granularity);

Target TargetFromProto(v1::Target target);  // TARGET_UNSPECIFIED = WEIGHT
v1::Target TargetToProto(Target target);

// The spec as sent or stored (defaults not filled in: QuantSpec::Resolve does that;
// a stored spec is already resolved). An unknown qscheme or target enum value is
// INVALID_ARGUMENT naming spec.qscheme or spec.target.
absl::StatusOr<QuantSpec> SpecFromProto(const v1::QuantSpec& spec);
// A resolved spec's message, every default explicit (float_range always present).
v1::QuantSpec SpecToProto(const QuantSpec& spec);

// A histogram session's parameters as sent or stored: an unknown nonfinite enum
// value is INVALID_ARGUMENT naming `field`.nonfinite; the core checks the rest
// (HistogramParams::Resolve), defaults included.
absl::StatusOr<HistogramParams> HistogramParamsFromProto(const v1::HistogramParams& params,
                                                         absl::string_view field = "histogram");
v1::HistogramParams HistogramParamsToProto(const HistogramParams& params);

}  // namespace qparams::types

#endif  // QPARAMS_TYPES_CODEC_H_
