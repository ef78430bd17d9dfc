#include "common/timestamp.h"

#include "google/protobuf/util/time_util.h"

namespace qparams {

google::protobuf::Timestamp TimestampFromTime(absl::Time time) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(time));
}

absl::Time TimeFromTimestamp(const google::protobuf::Timestamp& timestamp) {
  // TimeUtil::TimestampToNanoseconds would overflow int64 beyond the year 2262.
  return absl::FromUnixSeconds(timestamp.seconds()) + absl::Nanoseconds(timestamp.nanos());
}

}  // namespace qparams
