#include "export/engine_export_source.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "domain/session_cursor.h"

namespace qparams {

class EngineExportSource::Pass final : public ExportPass {
 public:
  explicit Pass(const EngineExportSource* source)
      : source_(source), cursor_(source->engine_, source->tenant_, source->prefix_) {}

  absl::StatusOr<const ExportItem*> Next() override {
    QPARAMS_ASSIGN_OR_RETURN(const SessionInfo* next, cursor_.Next());
    if (next == nullptr) return nullptr;
    item_.session = *next;
    item_.filled_group.clear();
    const auto grouped = source_->grouped_.find(next->name);
    if (grouped != source_->grouped_.end()) {
      item_.session.qparams = grouped->second.member.qparams;
      item_.session.initialized = true;  // a filled member has the group's global scale
      if (grouped->second.member.filled) item_.filled_group = grouped->second.group;
    }
    return &item_;
  }

 private:
  const EngineExportSource* const source_;
  SessionCursor cursor_;
  ExportItem item_;
};

absl::StatusOr<std::unique_ptr<EngineExportSource>> EngineExportSource::Create(
    const Engine* engine, std::string tenant, std::string prefix, ExportFormat format,
    const ExportGroupSource* groups) {
  std::unique_ptr<EngineExportSource> source(
      new EngineExportSource(engine, std::move(tenant), std::move(prefix)));
  if (groups != nullptr &&
      (format == ExportFormat::kCompressedTensors || format == ExportFormat::kModelOpt)) {
    QPARAMS_RETURN_IF_ERROR(source->LoadGroups(*groups));
  }
  return source;
}

std::unique_ptr<ExportPass> EngineExportSource::NewPass() const {
  return std::make_unique<Pass>(this);
}

absl::Status EngineExportSource::LoadGroups(const ExportGroupSource& source) {
  QPARAMS_ASSIGN_OR_RETURN(const std::vector<ExportGroupSource::Group> groups,
                           source.GlobalAmaxGroups(tenant_));
  auto exported = [&](const std::string& name) { return absl::StartsWith(name, prefix_); };
  for (const ExportGroupSource::Group& group : groups) {
    if (std::none_of(group.members.begin(), group.members.end(), exported)) continue;
    absl::StatusOr<ExportGroupSource::Result> result = source.GroupResult(tenant_, group.name);
    if (!result.ok()) {
      return absl::Status(result.status().code(), absl::StrCat("scale group ", group.name, ": ",
                                                               result.status().message()));
    }
    if (!result->initialized) {
      return absl::FailedPreconditionError(absl::StrCat(
          "scale group ", group.name, " (members ", absl::StrJoin(group.members, ", "),
          ") has uncalibrated members ", absl::StrJoin(result->uncalibrated, ", "),
          ", so it has no shared global scale to export: observe them",
          group.fill_uncalibrated
              ? " (fill_uncalibrated fills them only from a calibrated member)"
              : ", or create the group with fill_uncalibrated to give uncalibrated inputs its "
                "global scale"));
    }
    for (const ExportGroupSource::Member& member : result->members) {
      if (!exported(member.name)) continue;
      auto [it, added] = grouped_.try_emplace(member.name, Grouped{group.name, member});
      const std::optional<float>& kept = it->second.member.qparams.global_scale;
      const std::optional<float>& other = member.qparams.global_scale;
      if (!added && FloatBits(kept.value_or(0)) != FloatBits(other.value_or(0))) {
        return absl::FailedPreconditionError(absl::StrCat(
            "session ", member.name, " is a member of the GLOBAL_AMAX scale groups ",
            it->second.group, " and ", group.name, ", whose global scales differ (",
            FloatText(kept.value_or(0)), " and ", FloatText(other.value_or(0)),
            "): a checkpoint holds one; delete one of the groups"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace qparams
