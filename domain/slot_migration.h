// What a slot move (docs/sharding.md, "Moving slots online") copies and removes:
// the records of a slot range read out of one replica, imported into another, and
// dropped from the one that no longer owns them. Apart from SlotOwnership, which
// decides what a call may do; this only moves state, asking it for admissions.

#ifndef QPARAMS_DOMAIN_SLOT_MIGRATION_H_
#define QPARAMS_DOMAIN_SLOT_MIGRATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/scale_group.h"
#include "domain/scale_group_store.h"
#include "domain/session_store.h"
#include "domain/slot_ownership.h"
#include "storage/session_log.h"

namespace qparams {

// A session's or scale group's whole state as a move carries it: its storage
// record, serialized. Opaque outside the domain: the wire carries it as bytes.
struct SlotRecord {
  std::string bytes;
};

// How many sessions and scale groups a DropSlots removed, or an Import took.
struct SlotDrop {
  int64_t sessions = 0;
  int64_t groups = 0;
};
using SlotImport = SlotDrop;

class SlotMigration {
 public:
  // All must outlive this.
  SlotMigration(const SlotOwnership& ownership, SessionStore& store, ScaleGroupStore& groups,
                SessionLog& log)
      : ownership_(ownership), store_(store), groups_(groups), log_(log) {}

  // Engine's contracts of these (engine.h).
  absl::StatusOr<std::vector<SessionKey>> SlotSessionKeys(int low, int high) const;
  absl::StatusOr<std::vector<SlotRecord>> SlotGroupRecords(int low, int high) const;
  absl::StatusOr<SlotRecord> SessionRecord(const SessionKey& key) const;
  absl::StatusOr<SlotImport> Import(const std::vector<SlotRecord>& records);
  absl::StatusOr<SlotDrop> DropSlots(int low, int high);

 private:
  // One record of Import, journaled: its sequence number for the Sync.
  absl::StatusOr<uint64_t> ImportOne(const storage::v1::Record& record);

  const SlotOwnership& ownership_;
  SessionStore& store_;
  ScaleGroupStore& groups_;
  SessionLog& log_;
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SLOT_MIGRATION_H_
