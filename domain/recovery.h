// An engine's sessions and scale groups as storage records, and back: the
// journal's snapshots (Journal::Start's emitter), the restore of Engine::Open, and
// the tests and fuzzers that compare states. The Engine's own API speaks domain
// types only; this is the one door to its records.

#ifndef QPARAMS_DOMAIN_RECOVERY_H_
#define QPARAMS_DOMAIN_RECOVERY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "domain/engine.h"
#include "storage/journal.h"

namespace qparams {

class EngineRecords {
 public:
  // The session store's records (SessionStore::EmitRecords), then every group's
  // creation (ScaleGroupStore::EmitRecords); Of collects them.
  static absl::Status Emit(const Engine& engine, const Journal::Emitter& emit);
  static std::vector<storage::v1::Record> Of(const Engine& engine);
  // A group's record to the group store, any other to the session store (each says
  // what it does): the problem, if the record does not restore.
  static std::optional<std::string> Replay(Engine& engine, const storage::v1::Record& record);
  // Replays in order; the problems met.
  static std::vector<std::string> Restore(Engine& engine,
                                          const std::vector<storage::v1::Record>& records);

 private:
  friend class Engine;
  // Engine::Open's restore from `journal` (the engine's log), logged, and the
  // journal's start, with a snapshot if a record was set aside.
  static absl::Status Recover(Engine& engine, Journal& journal);
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_RECOVERY_H_
