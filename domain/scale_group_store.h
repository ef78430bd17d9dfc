// The scale groups of a server (nvfp4.md §4), by tenant and name: a thread-safe
// ordered map with a size limit, journaling creations and deletions through the
// session log as the session store does, so that groups survive a restart. A group
// is only a list of member names; its result is computed on demand from the members'
// sessions (Engine::GetGroupQParams), so a group restored without its members stays.
// Evicting or deleting a session never touches a group.

#ifndef QPARAMS_DOMAIN_SCALE_GROUP_STORE_H_
#define QPARAMS_DOMAIN_SCALE_GROUP_STORE_H_

#include <cstdint>
#include <functional>
#include <optional>
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
#include "qparams/storage/v1/storage.pb.h"
#include "storage/group_codec.h"
#include "storage/journal.h"
#include "storage/session_log.h"

namespace qparams {

// ScaleGroupInfo, the value a group is, lives beside its records in
// storage/group_codec.h.

// A group's members: 1 to kMaxGroupMembers distinct session names. INVALID_ARGUMENT
// naming the first offending entry otherwise.
absl::Status ValidateGroupMembers(const std::vector<std::string>& members);

// Thread safety: every method may be called concurrently; each takes the map's lock
// only. Lock order: the map's lock, then the log's (Create and Erase append under
// the map's lock, so one group's records keep their order; they sync after it).
class ScaleGroupStore {
 public:
  // Creations and deletions are appended to `log` (a NullSessionLog when nothing is
  // persisted), which must outlive the store.
  ScaleGroupStore(int64_t max_groups, SessionLog& log) : max_groups_(max_groups), log_(log) {}

  // ALREADY_EXISTS if the tenant has a group of that name, RESOURCE_EXHAUSTED at
  // max_groups, or the log's error (UNAVAILABLE once it is broken), which adds no
  // group. A Sync failure after the append is returned with the group added, as
  // SessionStore::Create does.
  absl::Status Create(absl::string_view tenant, const ScaleGroupInfo& group);
  // NOT_FOUND for an unknown group.
  absl::StatusOr<ScaleGroupInfo> Find(absl::string_view tenant, absl::string_view name) const;
  // NOT_FOUND for an unknown group, or the log's error, which keeps the group (as
  // Create says for a Sync failure).
  absl::Status Erase(absl::string_view tenant, absl::string_view name);

  // Up to `limit` groups of `tenant` whose names start with `prefix`, sort after
  // `after` and pass `keep` (if given; called under the map's reader lock, so it must
  // not call back into the store), in name order, and whether more follow.
  struct Page {
    std::vector<ScaleGroupInfo> groups;
    bool more = false;
  };
  Page List(absl::string_view tenant, absl::string_view prefix, absl::string_view after,
            int limit, const std::function<bool(absl::string_view name)>& keep = nullptr) const;

  // Every group as its creation record, in key order, for a snapshot, a batch at a
  // time (emit runs without the lock); stops at emit's first error and returns it.
  // Groups created or deleted meanwhile may be left out or in: replaying the journal
  // after the snapshot settles them.
  absl::Status EmitRecords(const Journal::Emitter& emit) const;

  // Applies one group_create or group_delete record without journaling it (any other
  // record is not the store's: nothing). The last record of a key wins; the limit
  // is not applied. A creation that does not decode, or whose names are invalid,
  // leaves the key without a group and returns the problem.
  std::optional<std::string> Replay(const storage::v1::Record& record);

  // A group's creation record taken from another replica (a slot move): checked as
  // Replay checks it (INVALID_ARGUMENT naming the problem) and journaled, replacing a
  // group of the same key, so that importing it again changes nothing. Not synced:
  // returns the record's sequence number for the caller's Sync. The limit is not
  // applied (the group exists in the deployment already). The log's error imports
  // nothing.
  absl::StatusOr<uint64_t> Import(const storage::v1::ScaleGroup& record);

  // The creation records of every group (all tenants) whose name passes `keep`
  // (called under the map's reader lock), in key order.
  std::vector<storage::v1::Record> RecordsWhere(
      const std::function<bool(absl::string_view name)>& keep) const;

  int64_t size() const;

 private:
  static std::string MapKey(absl::string_view tenant, absl::string_view name);

  const int64_t max_groups_;
  SessionLog& log_;
  mutable absl::Mutex mu_;
  absl::btree_map<std::string, ScaleGroupInfo> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SCALE_GROUP_STORE_H_
