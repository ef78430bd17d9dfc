// What an export reads of the caller's GLOBAL_AMAX scale groups: the interface, so
// that tests can give an export groups without an engine
// (export/engine_group_source.h reads the engine's).

#ifndef QPARAMS_EXPORT_EXPORT_GROUP_SOURCE_H_
#define QPARAMS_EXPORT_EXPORT_GROUP_SOURCE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/qparams.h"

namespace qparams {

// What an export reads of the caller's GLOBAL_AMAX scale groups (nvfp4.md section 4).
// Implementations are thread-safe; their errors are passed on.
class ExportGroupSource {
 public:
  struct Group {
    std::string name;
    std::vector<std::string> members;  // session names, in member order
    bool fill_uncalibrated = false;
  };
  struct Member {
    std::string name;
    QParams qparams;      // with the group's global_scale; no blocks when filled
    bool filled = false;  // uncalibrated, given the group's global scale
  };
  // GetGroupQParams of a GLOBAL_AMAX group.
  struct Result {
    bool initialized = false;
    std::vector<std::string> uncalibrated;  // in member order
    float global_scale = 0;
    std::vector<Member> members;  // every member, in member order
  };

  virtual ~ExportGroupSource() = default;
  // Every GLOBAL_AMAX group of `tenant`.
  virtual absl::StatusOr<std::vector<Group>> GlobalAmaxGroups(const std::string& tenant) const = 0;
  // The group's shared result (nvfp4.md 4.2).
  virtual absl::StatusOr<Result> GroupResult(const std::string& tenant,
                                             const std::string& group) const = 0;
};

}  // namespace qparams

#endif  // QPARAMS_EXPORT_EXPORT_GROUP_SOURCE_H_
