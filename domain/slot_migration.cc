#include "domain/slot_migration.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "core/status_macros.h"
#include "qparams/storage/v1/storage.pb.h"

namespace qparams {
namespace {

bool InRange(absl::string_view name, int low, int high) {
  const int slot = SlotOf(name);
  return slot >= low && slot <= high;
}

}  // namespace

absl::StatusOr<std::vector<SessionKey>> SlotMigration::SlotSessionKeys(int low, int high) const {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  return store_.KeysWhere([low, high](absl::string_view name) { return InRange(name, low, high); });
}

absl::StatusOr<std::vector<SlotRecord>> SlotMigration::SlotGroupRecords(int low, int high) const {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  std::vector<SlotRecord> out;
  for (const storage::v1::Record& record : groups_.RecordsWhere(
           [low, high](absl::string_view name) { return InRange(name, low, high); })) {
    out.push_back({record.SerializeAsString()});
  }
  return out;
}

absl::StatusOr<SlotRecord> SlotMigration::SessionRecord(const SessionKey& key) const {
  QPARAMS_ASSIGN_OR_RETURN(const std::shared_ptr<Session> session, store_.Find(key));
  storage::v1::Record record;
  *record.mutable_put() = session->Record();
  // Retired after the lookup: its record would bring a deleted session back.
  QPARAMS_RETURN_IF_ERROR(store_.Find(key).status());
  return SlotRecord{record.SerializeAsString()};
}

absl::StatusOr<SlotImport> SlotMigration::Import(const std::vector<SlotRecord>& records) {
  std::vector<storage::v1::Record> parsed(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    if (!parsed[i].ParseFromString(records[i].bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("records[", i, "] is not a storage record"));
    }
  }
  uint64_t sequence = 0;
  absl::Status status;
  SlotImport imported;
  for (size_t i = 0; i < parsed.size() && status.ok(); ++i) {
    absl::StatusOr<uint64_t> one = ImportOne(parsed[i]);
    if (one.ok()) {
      sequence = std::max(sequence, *one);
      ++(parsed[i].kind_case() == storage::v1::Record::kPut ? imported.sessions : imported.groups);
    } else {
      status = absl::Status(one.status().code(),
                            absl::StrCat("records[", i, "]: ", one.status().message()));
    }
  }
  const absl::Status synced = log_.Sync(sequence);
  QPARAMS_RETURN_IF_ERROR(status.ok() ? synced : status);
  return imported;
}

absl::StatusOr<uint64_t> SlotMigration::ImportOne(const storage::v1::Record& record) {
  std::string name;
  if (record.kind_case() == storage::v1::Record::kPut) {
    name = record.put().key().name();
  } else if (record.kind_case() == storage::v1::Record::kGroupCreate) {
    name = record.group_create().key().name();
  } else {
    return absl::InvalidArgumentError(
        "record: a move imports a session's state (put) or a scale group's creation "
        "(group_create), nothing else");
  }
  const SlotOwnership::WriteAdmission admission(ownership_, name);
  if (admission.OwnsSlot() || admission.state() != SlotMoveState::kImporting) {
    return absl::FailedPreconditionError(absl::StrCat(
        "\"", name, "\" is of slot ", admission.slot(), ", which this replica ",
        ownership_.replica_id(), admission.OwnsSlot() ? " owns already" : " is not importing",
        "; a move imports only into slots the target is importing (reshard marks them)"));
  }
  if (record.kind_case() == storage::v1::Record::kPut) return store_.Import(record.put());
  return groups_.Import(record.group_create());
}

absl::StatusOr<SlotDrop> SlotMigration::DropSlots(int low, int high) {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  // Held to the end: the slots do not become this replica's while it drops them.
  const SlotOwnership::ReadAdmission admission(ownership_);
  if (admission.map() == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no slot map: it owns every slot, so it drops none");
  }
  for (int slot = low; slot <= high; ++slot) {
    if (admission.map()->OwnerOf(slot) == ownership_.replica_id()) {
      return absl::FailedPreconditionError(
          absl::StrCat("slot ", slot, " belongs to this replica ", ownership_.replica_id(),
                       "; its sessions there are the live ones, and are not dropped"));
    }
  }
  SlotDrop dropped;
  for (const storage::v1::Record& group : groups_.RecordsWhere(
           [low, high](absl::string_view name) { return InRange(name, low, high); })) {
    const absl::Status erased =
        groups_.Erase(group.group_create().key().tenant(), group.group_create().key().name());
    if (!erased.ok() && !absl::IsNotFound(erased)) return erased;
    if (erased.ok()) ++dropped.groups;
  }
  QPARAMS_ASSIGN_OR_RETURN(const std::vector<SessionKey> keys, SlotSessionKeys(low, high));
  QPARAMS_ASSIGN_OR_RETURN(dropped.sessions, store_.EraseAll(keys));
  return dropped;
}

}  // namespace qparams
