// The scale groups of a server (nvfp4.md §4), by tenant and name: a thread-safe
// ordered map with a size limit. A group is only a list of member names; its result
// is computed on demand from the members' sessions (Engine::GetGroupQParams).
// Groups are kept in memory only: they are not journaled yet.

#ifndef QPARAMS_DOMAIN_SCALE_GROUP_STORE_H_
#define QPARAMS_DOMAIN_SCALE_GROUP_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/scale_group.h"

namespace qparams {

struct ScaleGroupInfo {
  std::string name;
  std::vector<std::string> members;
  GroupShare share = GroupShare::kGlobalAmax;
  bool fill_uncalibrated = false;
  absl::Time create_time;
};

// Thread safety: every method may be called concurrently; each takes the map's lock
// only.
class ScaleGroupStore {
 public:
  explicit ScaleGroupStore(int64_t max_groups) : max_groups_(max_groups) {}

  // ALREADY_EXISTS if the tenant has a group of that name, RESOURCE_EXHAUSTED at
  // max_groups.
  absl::Status Create(absl::string_view tenant, const ScaleGroupInfo& group);
  // NOT_FOUND for an unknown group.
  absl::StatusOr<ScaleGroupInfo> Find(absl::string_view tenant, absl::string_view name) const;
  absl::Status Erase(absl::string_view tenant, absl::string_view name);

  // Up to `limit` groups of `tenant` whose names start with `prefix` and sort after
  // `after`, in name order, and whether more follow.
  struct Page {
    std::vector<ScaleGroupInfo> groups;
    bool more = false;
  };
  Page List(absl::string_view tenant, absl::string_view prefix, absl::string_view after,
            int limit) const;

 private:
  static std::string MapKey(absl::string_view tenant, absl::string_view name);

  const int64_t max_groups_;
  mutable absl::Mutex mu_;
  absl::btree_map<std::string, ScaleGroupInfo> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SCALE_GROUP_STORE_H_
