#include "core/scale_group.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/nvfp4.h"

namespace qparams {

absl::string_view GroupShareName(GroupShare share) {
  return share == GroupShare::kGlobalAmax ? "global_amax" : "union_range";
}

absl::Status CheckGroupShare(GroupShare share, const QuantSpec& spec) {
  if (share == GroupShare::kGlobalAmax && !spec.nvfp4_scale()) {
    return absl::InvalidArgumentError(
        "share GLOBAL_AMAX shares an NVFP4 global scale; the members' spec needs scale_dtype "
        "float8_e4m3fn (use UNION_RANGE for integer and fp8 per_tensor members)");
  }
  if (share == GroupShare::kUnionRange &&
      (spec.nvfp4_scale() || spec.granularity.kind() != Granularity::Kind::kPerTensor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "share UNION_RANGE gives one per_tensor scale; the members' spec has granularity ",
        spec.granularity.ToString(), spec.nvfp4_scale() ? " and scale_dtype float8_e4m3fn" : "",
        " (use GLOBAL_AMAX for NVFP4 members)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<GroupResult> ComputeGroupQParams(GroupShare share, bool fill_uncalibrated,
                                                const std::vector<GroupMemberState>& members) {
  if (members.empty()) return absl::InvalidArgumentError("a group has at least one member");
  // Step 2: the specs still agree (a member's granularity may have changed since).
  const QuantSpec& spec = members.front().spec;
  for (const GroupMemberState& m : members) {
    if (!(m.spec == spec)) {
      return absl::FailedPreconditionError(
          absl::StrCat("member \"", m.name, "\" has a spec that no longer agrees with member \"",
                       members.front().name, "\"'s (granularity ", m.spec.granularity.ToString(),
                       " vs ", spec.granularity.ToString(), ")"));
    }
  }
  if (absl::Status s = CheckGroupShare(share, spec); !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  // Step 3: uncalibrated members.
  GroupResult result;
  const GroupMemberState* first = nullptr;
  for (const GroupMemberState& m : members) {
    if (!m.initialized) {
      result.uncalibrated.push_back(m.name);
      continue;
    }
    if (!m.range.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "member \"", m.name,
          "\" keeps no range the group can read: a histogram calculator, or a static "
          "session restored from a record written before static sessions kept theirs "
          "(observe it again)"));
    }
    if (first == nullptr) first = &m;
  }
  if (first == nullptr || (!result.uncalibrated.empty() && !fill_uncalibrated)) return result;
  // Step 4: one working precision.
  const DType precision = first->range->precision;
  for (const GroupMemberState& m : members) {
    if (m.initialized && m.range->precision != precision) {
      return absl::FailedPreconditionError(absl::StrCat(
          "members' input dtypes differ: member \"", m.name, "\" computes in ",
          DTypeName(m.range->precision), ", member \"", first->name, "\" in ",
          DTypeName(precision)));
    }
  }
  result.initialized = true;
  if (share == GroupShare::kUnionRange) {
    double lo = 0, hi = 0;
    for (const GroupMemberState& m : members) {
      if (!m.initialized) continue;
      for (double v : m.range->lo) lo = std::min(lo, v);
      for (double v : m.range->hi) hi = std::max(hi, v);
    }
    // Every member range already includes 0, so starting from 0 changes nothing.
    result.min = static_cast<float>(lo);
    result.max = static_cast<float>(hi);
    result.qparams = QParamsFromRange(QParamsRecipe::FromSpec(spec),
                                      WorkingRange{precision, Shape{1}, {lo}, {hi}});
    return result;
  }
  const Nvfp4Convention convention = *QParamsRecipe::FromSpec(spec).nvfp4;
  std::vector<std::vector<double>> block_amax(members.size());
  double group_amax = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const GroupMemberState& m = members[i];
    if (!m.initialized) continue;
    for (size_t b = 0; b < m.range->lo.size(); ++b) {
      block_amax[i].push_back(Nvfp4BlockAmax(m.range->lo[b], m.range->hi[b]));
      group_amax = std::max(group_amax, block_amax[i].back());
    }
  }
  const float g = Nvfp4GlobalScale(group_amax, precision, convention);
  result.amax = static_cast<float>(group_amax);
  result.global_scale = g;
  for (size_t i = 0; i < members.size(); ++i) {
    const GroupMemberState& m = members[i];
    GroupMemberResult& out = result.members.emplace_back();
    out.name = m.name;
    out.qparams = QParams::Empty(false, false);
    out.qparams.global_scale = g;
    if (!m.initialized) continue;  // filled: the group's scale, no blocks
    QParams& q = out.qparams;
    q.shape = m.range->shape;
    q.precision = precision;
    double member_amax = 0;
    for (double a : block_amax[i]) {
      const uint8_t code = Nvfp4BlockScaleCode(a, g, precision, convention);
      q.scale_e4m3.push_back(code);
      member_amax = std::max(member_amax, a);
    }
    q.amax = static_cast<float>(member_amax);
    out.amax = q.amax;
  }
  return result;
}

}  // namespace qparams
