#include "export/engine_group_source.h"

#include <utility>

#include "core/status_macros.h"

namespace qparams {

absl::StatusOr<std::vector<ExportGroupSource::Group>> EngineGroupSource::GlobalAmaxGroups(
    const std::string& tenant) const {
  std::vector<Group> groups;
  std::string token;
  do {
    QPARAMS_ASSIGN_OR_RETURN(ScaleGroupPage page,
                             engine_->ListScaleGroups(tenant, Engine::kMaxPageSize, token, ""));
    for (ScaleGroupInfo& info : page.groups) {
      if (info.share != GroupShare::kGlobalAmax) continue;
      groups.push_back({std::move(info.name), std::move(info.members), info.fill_uncalibrated});
    }
    token = std::move(page.next_page_token);
  } while (!token.empty());
  return groups;
}

absl::StatusOr<ExportGroupSource::Result> EngineGroupSource::GroupResult(
    const std::string& tenant, const std::string& group) const {
  QPARAMS_ASSIGN_OR_RETURN(qparams::GroupResult computed, engine_->GetGroupQParams(tenant, group));
  Result result;
  result.initialized = computed.initialized;
  result.uncalibrated = std::move(computed.uncalibrated);
  result.global_scale = computed.global_scale;
  for (GroupMemberResult& member : computed.members) {
    const bool filled = computed.initialized && !member.amax.has_value();
    result.members.push_back({std::move(member.name), std::move(member.qparams), filled});
  }
  return result;
}

}  // namespace qparams
