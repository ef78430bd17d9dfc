// The engine's scale groups as an export reads them (ExportGroupSource over
// Engine::ListScaleGroups and Engine::GetGroupQParams).

#ifndef QPARAMS_EXPORT_ENGINE_GROUP_SOURCE_H_
#define QPARAMS_EXPORT_ENGINE_GROUP_SOURCE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "domain/engine.h"
#include "export/export_group_source.h"

namespace qparams {

// Thread-safe as the engine is; the engine must outlive it. The engine's errors are
// passed on unchanged.
class EngineGroupSource : public ExportGroupSource {
 public:
  explicit EngineGroupSource(const Engine* engine) : engine_(engine) {}

  // Every GLOBAL_AMAX group of `tenant`, in name order (all pages of ListScaleGroups).
  absl::StatusOr<std::vector<Group>> GlobalAmaxGroups(const std::string& tenant) const override;
  // Engine::GetGroupQParams; a member of an initialized result without its own amax
  // is a filled one.
  absl::StatusOr<Result> GroupResult(const std::string& tenant,
                                     const std::string& group) const override;

 private:
  const Engine* const engine_;
};

}  // namespace qparams

#endif  // QPARAMS_EXPORT_ENGINE_GROUP_SOURCE_H_
