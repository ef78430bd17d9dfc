// Scale groups (nvfp4.md §4): the pure arithmetic of several sessions sharing their
// scales, over the members' current states. GLOBAL_AMAX gives every NVFP4 member the
// global scale of the largest member amax; UNION_RANGE gives every per_tensor member
// the qparams of the union of their ranges. The formulas are those of core/nvfp4.h
// and core/qparams.h; this file only combines the members.

#ifndef QPARAMS_CORE_SCALE_GROUP_H_
#define QPARAMS_CORE_SCALE_GROUP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/qparams.h"
#include "core/quant_spec.h"

namespace qparams {

enum class GroupShare { kGlobalAmax, kUnionRange };

// "global_amax" or "union_range".
absl::string_view GroupShareName(GroupShare share);

// At most this many members a group (INVALID_ARGUMENT beyond).
inline constexpr int kMaxGroupMembers = 1024;

// The 4.1 rules between a share and the members' common resolved spec:
// INVALID_ARGUMENT for GLOBAL_AMAX without scale_dtype float8_e4m3fn, or UNION_RANGE
// on a float8_e4m3fn spec or a granularity other than per_tensor.
absl::Status CheckGroupShare(GroupShare share, const QuantSpec& resolved_spec);

// One member as the group reads it.
struct GroupMemberState {
  std::string name;
  QuantSpec spec;                     // resolved, with the current granularity
  bool initialized = false;
  std::optional<WorkingRange> range;  // its current range (lo, hi) once initialized
};

struct GroupMemberResult {
  std::string name;
  QParams qparams;            // GLOBAL_AMAX: own block codes with the group's scale
  std::optional<float> amax;  // the member's own amax; unset for a filled member
};

struct GroupResult {
  bool initialized = false;
  std::vector<std::string> uncalibrated;  // in member order
  // GLOBAL_AMAX
  float amax = 0;
  float global_scale = 0;
  std::vector<GroupMemberResult> members;
  // UNION_RANGE
  float min = 0;
  float max = 0;
  QParams qparams;
};

// The group result of nvfp4.md §4.2, steps 2 to 5, from `members` (at least one, in
// member order). FAILED_PRECONDITION naming the member when the members' specs no
// longer agree (or the spec no longer fits the share), when an initialized member
// has no range to read, or when the initialized members' working precisions differ.
// An uncalibrated member (without fill_uncalibrated, or with none calibrated) gives
// initialized false, not an error. Thread-safe.
absl::StatusOr<GroupResult> ComputeGroupQParams(GroupShare share, bool fill_uncalibrated,
                                                const std::vector<GroupMemberState>& members);

}  // namespace qparams

#endif  // QPARAMS_CORE_SCALE_GROUP_H_
