// google.protobuf.Timestamp <-> absl::Time: the one conversion, for the wire
// (proto/convert.h) and the storage codec (storage/session_codec.h) alike.

#ifndef QPARAMS_COMMON_TIMESTAMP_H_
#define QPARAMS_COMMON_TIMESTAMP_H_

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace qparams {

// Through protobuf's TimeUtil (nanoseconds, normalized).
google::protobuf::Timestamp TimestampFromTime(absl::Time time);
// Saturating: a timestamp beyond absl::Time's range (read from anywhere) reads as
// the infinite past or future, never overflows.
absl::Time TimeFromTimestamp(const google::protobuf::Timestamp& timestamp);

}  // namespace qparams

#endif  // QPARAMS_COMMON_TIMESTAMP_H_
