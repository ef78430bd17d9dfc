// The domain behind QParamsService: stateless Compute and the named sessions, with
// the rules of the contract that are not about the wire (which calculators each
// method takes, names, pagination, limits). It knows nothing of gRPC; the service
// translates wire messages to these calls and back.
//
// An Engine composes a SessionStore, a ScaleGroupStore, a SlotOwnership (the slot
// map and the move gates, which admit each call: slot_ownership.h) and a
// SlotMigration (a move's copies and drops: slot_migration.h); its records, for the
// journal and the tests, are EngineRecords' (recovery.h).

#ifndef QPARAMS_DOMAIN_ENGINE_H_
#define QPARAMS_DOMAIN_ENGINE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/page_token.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "core/granularity.h"
#include "core/histogram.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/quant_spec.h"
#include "core/registry.h"
#include "core/scale_group.h"
#include "domain/scale_group_store.h"
#include "domain/session.h"
#include "domain/session_store.h"
#include "domain/slot_migration.h"
#include "domain/slot_moves.h"
#include "domain/slot_ownership.h"
#include "domain/step_timer.h"
#include "metrics/metrics.h"
#include "storage/journal.h"
#include "storage/session_log.h"

namespace qparams {

struct EngineOptions {
  int64_t max_sessions = 100000;
  // Scale groups per server (all tenants together); CreateScaleGroup beyond it is
  // RESOURCE_EXHAUSTED naming --max_scale_groups. The server's flag is >= 1.
  int64_t max_scale_groups = 100000;
  // Sessions no call has named for this long are evicted; zero keeps them forever.
  // Eviction starts once the engine is ready (after Open's restore).
  absl::Duration session_ttl = absl::ZeroDuration();
  // The time idle eviction reads; null: absl::Now. A seam for tests.
  std::function<absl::Time()> eviction_clock;
  // Sharding: with a slot map, this engine is replica `replica_id` and owns only
  // the sessions of the slots the map gives it (none, for a replica the map does
  // not name yet: a new one waiting for a move). Null: it owns every session. The
  // map at start: Open takes instead the one persisted in the data directory if its
  // epoch is greater, and Engine::SetSlotMap replaces it while serving.
  std::shared_ptr<const SlotMap> slot_map;
  std::string replica_id;
  // Counts the observations applied (a session's count went up); null: not counted.
  // Must outlive the engine.
  Counter* observations = nullptr;
  // Step-merged sessions (docs/qat.md): how long a step may stay open before it is
  // closed with the contributions it has, unless a contribution names another; and
  // the counters of contributions taken (retries excluded) and of steps closed with
  // ranks missing (null: not counted; they must outlive the engine).
  absl::Duration step_timeout = absl::Minutes(5);
  Counter* step_contributions = nullptr;
  Counter* steps_closed_incomplete = nullptr;
  // Persistence, for Engine::Open: with a data_dir, the sessions and scale groups are
  // restored from that directory and every mutation is journaled to it
  // (storage/journal.h); with none, nothing is persisted.
  JournalOptions journal;
};

// Engine::Observe's answer, failed or not: the responses of ObserveStream and
// ObserveBatch report the session's count beside a failure too.
struct ObserveOutcome {
  absl::Status status;
  // On failure only observation_count is set: the session's count, which a failure
  // leaves as it was (0 when no session was found).
  ObserveResult result;
};

// One page of ListSessions.
struct SessionPage {
  std::vector<SessionInfo> sessions;
  std::string next_page_token;  // empty on the last page
};

// What CreateScaleGroup is asked for; share unset is SHARE_UNSPECIFIED.
struct ScaleGroupRequest {
  std::string name;
  std::vector<std::string> members;
  std::optional<GroupShare> share;
  bool fill_uncalibrated = false;
};

// One page of ListScaleGroups.
struct ScaleGroupPage {
  std::vector<ScaleGroupInfo> groups;
  std::string next_page_token;  // empty on the last page
};

class Engine {
 public:
  // common/page_token.h's, which every List method pages by.
  static constexpr int kDefaultPageSize = ::qparams::kDefaultPageSize;
  static constexpr int kMaxPageSize = ::qparams::kMaxPageSize;

  // A ready engine: every startup decision is made here, in this order. With
  // options.journal.data_dir: the directory opened and locked, a sharded engine's
  // map chosen (SlotOwnership::ChooseSlotMap: the greater epoch of options.slot_map
  // and the directory's kSlotMapFileName), its sessions and scale groups restored (a
  // record that does not restore, or a torn or corrupt piece of a file, is logged and
  // set aside, and a snapshot then drops what was skipped), the journal started, the
  // restore logged, and the slot moves loaded (kSlotMovesFileName). Then, and only
  // then, idle eviction starts. FAILED_PRECONDITION for a directory that cannot be
  // opened, locked or read (Journal::Open, Recover), or a persisted map or moves file
  // that does not parse; the journal's error if it cannot start. Without a data_dir,
  // as the constructor.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(EngineOptions options);

  // Memory only (options.journal is not used: Open persists). With a session_ttl, a
  // background thread evicts idle sessions.
  explicit Engine(EngineOptions options = {});
  // Closes the session log (Close).
  ~Engine();

  // Makes every acknowledged mutation durable and stops the journal's background
  // work (SessionLog::Close): call once no call is in flight. Idempotent.
  absl::Status Close() { return log_->Close(); }

  // Where the engine persists: a Journal, or a NullSessionLog that keeps nothing.
  const SessionLog& log() const { return *log_; }

  // The registry's classes, sorted by key ("default" among them, stateful).
  std::vector<const CalculatorClass*> ListCalculators() const;

  // The qparams of one observation with a fresh `calculator`: "" or "dynamic", or
  // "static". Other keys are INVALID_ARGUMENT (naming CreateSession for the
  // stateful ones), as are a bad spec and a bad observation. Stores nothing.
  absl::StatusOr<QParams> Compute(absl::string_view calculator, const QuantSpec& spec,
                                  const Observation& x) const;

  // A new session of `calculator` ("" = default, resolved by spec.target) with its
  // constructor options (averaging_constant for moving_average, histogram for
  // percentile, entropy and mse). "dynamic" is INVALID_ARGUMENT naming Compute; so
  // are a bad name, spec or option, and an option set for a calculator that does not
  // take it. ALREADY_EXISTS / RESOURCE_EXHAUSTED from the store.
  absl::StatusOr<SessionInfo> CreateSession(absl::string_view tenant, absl::string_view name,
                                            absl::string_view calculator, const QuantSpec& spec,
                                            const CalculatorOptions& options);

  // Every session method names a session of `tenant` ("" when authentication is
  // off): INVALID_ARGUMENT for a malformed name, FAILED_PRECONDITION naming the
  // owner (and carrying it as kOwnerPayload, common/slot.h) for a session another
  // replica owns, which changes nothing, NOT_FOUND for an unknown one (or one
  // evicted after being idle, saying so). CreateSession refuses the first two the
  // same way.
  absl::StatusOr<SessionInfo> GetSession(absl::string_view tenant, absl::string_view name) const;
  absl::Status DeleteSession(absl::string_view tenant, absl::string_view name);

  // Sessions ordered by name whose names start with `filter`. page_size 0 means
  // kDefaultPageSize; it is capped at kMaxPageSize; negative is INVALID_ARGUMENT,
  // as is a page token issued for another filter. Sharded: only the sessions this
  // replica owns (a copy of another's, left by a slot move, is never listed, read
  // or exported: its owner's is the live one).
  absl::StatusOr<SessionPage> ListSessions(absl::string_view tenant, int page_size,
                                           absl::string_view page_token,
                                           absl::string_view filter) const;

  // One forward on the session; `omit_qparams` as Session::Observe says (a
  // histogram session then runs no search). `x` is the observation, or why the
  // request holds none: that refusal comes before the name's. Whatever the status,
  // the outcome carries the session's observation count.
  //
  // `key`: the observation's idempotency key (docs/retries.md), checked after the
  // observation and before the name (INVALID_ARGUMENT: ValidateObserveKey); the
  // session applies a key at most once (Session::Observe), answering a duplicate
  // with the original count and ObserveResult::duplicate, which the observations
  // counter does not count.
  ObserveOutcome Observe(absl::string_view tenant, absl::string_view name,
                         const absl::StatusOr<Observation>& x, bool omit_qparams = false,
                         const std::optional<ObserveKey>& key = std::nullopt);

  // get_qparams: the buffers and the initialized flag (and a histogram session's
  // calibration, running its search if the histogram changed since it last ran).
  absl::StatusOr<CachedQParams> GetQParams(absl::string_view tenant, absl::string_view name) const;

  // The histogram of a percentile, entropy or mse session; INVALID_ARGUMENT for a
  // session of another calculator.
  absl::StatusOr<Histogram> GetHistogram(absl::string_view tenant, absl::string_view name) const;

  absl::StatusOr<SessionInfo> SetExportMode(absl::string_view tenant, absl::string_view name,
                                            bool enabled);

  // `granularity` unset is INVALID_ARGUMENT; an initialized session is
  // FAILED_PRECONDITION whatever the granularity.
  absl::StatusOr<SessionInfo> SetGranularity(absl::string_view tenant, absl::string_view name,
                                             const std::optional<Granularity>& granularity);

  // Scale groups (nvfp4.md §4), per tenant; a group names sessions of its own
  // tenant only (another tenant's session is NOT_FOUND). CreateScaleGroup: the table
  // of 4.1 (INVALID_ARGUMENT for a malformed name, no members, a duplicate, more
  // than kMaxGroupMembers, an unset share, specs that differ or that the share does
  // not take; NOT_FOUND for a missing member; ALREADY_EXISTS; RESOURCE_EXHAUSTED at
  // max_scale_groups). Sharded: the group's slot must be this replica's (refused as
  // a session's is) and every member must hash to it (INVALID_ARGUMENT explaining
  // hash tags). Creating or deleting a group changes no session, and evicting or
  // deleting a session changes no group. Creations and deletions are journaled and
  // synced as sessions' mutations are (Open restores the groups, also those whose
  // members are gone); a broken journal is UNAVAILABLE. A failure changes nothing,
  // but for an fsync that fails after the append under kAlways (the mutation stays
  // in memory, as CreateSession's does: ScaleGroupStore::Create).
  absl::StatusOr<ScaleGroupInfo> CreateScaleGroup(absl::string_view tenant,
                                                  const ScaleGroupRequest& request);
  absl::StatusOr<ScaleGroupInfo> GetScaleGroup(absl::string_view tenant,
                                               absl::string_view name) const;
  // Paging, filter and (sharded) the owned slots exactly as ListSessions.
  absl::StatusOr<ScaleGroupPage> ListScaleGroups(absl::string_view tenant, int page_size,
                                                 absl::string_view page_token,
                                                 absl::string_view filter) const;
  // NOT_FOUND for an unknown group; the journal's error as CreateScaleGroup says.
  absl::Status DeleteScaleGroup(absl::string_view tenant, absl::string_view name);
  // The shared result, in the order of 4.2: NOT_FOUND for an unknown group,
  // FAILED_PRECONDITION naming a deleted member or a member whose spec no longer
  // agrees, initialized false while members are uncalibrated (unless
  // fill_uncalibrated), FAILED_PRECONDITION when the members' input dtypes differ.
  // Each member is read under its own lock, one after the other.
  absl::StatusOr<GroupResult> GetGroupQParams(absl::string_view tenant,
                                              absl::string_view name) const;

  // Evicts the sessions no call has named since `now - session_ttl` (nothing
  // without a TTL); returns how many. The background thread calls it with the time.
  int EvictIdle(absl::Time now);

  // ---- Step-merged sessions (shared/docs/qat.md; domain/engine_steps.cc) ----
  // Session::Contribute on session `name`, under an observation's ownership and
  // slot-move gates; then the session's lowest open step is armed to close after
  // `step_timeout` (unset: EngineOptions::step_timeout; INVALID_ARGUMENT unless > 0).
  absl::StatusOr<StepMerge::Outcome> Contribute(absl::string_view tenant, absl::string_view name,
                                                int64_t step, int32_t rank, int32_t world_size,
                                                const std::optional<Observation>& x,
                                                std::optional<absl::Duration> step_timeout);
  // The qparams of session `name` as of step `step` (unset: the latest applied),
  // waiting until `deadline` for that step to be applied (Session::AwaitStep), with
  // no lock of the engine held meanwhile.
  absl::StatusOr<Session::StepRead> ReadStep(absl::string_view tenant, absl::string_view name,
                                             std::optional<int64_t> step, absl::Time deadline) const;
  // The steps of session `name` (unset: never stepped).
  absl::StatusOr<std::optional<StepState>> Steps(absl::string_view tenant,
                                                 absl::string_view name) const;
  // A wait for step `step` of session `name` that holds no thread (the Step RPC):
  // unset if the step is applied already (read it at once); else `ready` runs, on
  // the thread that applies it, unless the wait is cancelled first. NOT_FOUND for a
  // session that does not exist.
  class StepWait {
   public:
    StepWait(std::shared_ptr<Session> session, uint64_t id)
        : session_(std::move(session)), id_(id) {}
    // After it, `ready` does not start (it may be running already).
    void Cancel() const { session_->CancelWait(id_); }

   private:
    std::shared_ptr<Session> session_;
    uint64_t id_;
  };
  absl::StatusOr<std::optional<StepWait>> WhenStepApplied(absl::string_view tenant,
                                                          absl::string_view name, int64_t step,
                                                          std::function<void()> ready) const;
  // Session::Checkpoint of session `name`.
  absl::StatusOr<std::string> CheckpointStep(absl::string_view tenant, absl::string_view name,
                                             int64_t step) const;
  // Session::Resume of session `name`, under an observation's ownership and slot-move
  // gates; the step timer forgets nothing (a timeout of a discarded step finds it
  // applied and closes nothing).
  absl::Status ResumeSteps(absl::string_view tenant, absl::string_view name, int64_t next_step,
                           absl::string_view checkpoint);

  int64_t session_count() const { return store_.size(); }
  int64_t scale_group_count() const { return groups_.size(); }
  // SessionStore::SessionsPerTenant. Thread-safe.
  std::vector<std::pair<std::string, int64_t>> SessionsPerTenant() const {
    return store_.SessionsPerTenant();
  }

  // ---- Moving slots (docs/sharding.md, "Moving slots online") ----
  //
  // Every write naming a session or scale group (CreateSession, DeleteSession,
  // Observe, SetExportMode, SetGranularity, CreateScaleGroup, DeleteScaleGroup)
  // holds its slot's gate shared from its checks to its last journal append, and a
  // write to a slot this replica owns but is migrating is UNAVAILABLE ("slot S is
  // moving to rX; retry"), after the name's and the owner's refusals. Reads are served.
  // Eviction of idle sessions holds the gate too, and skips the sessions of slots
  // migrating or importing (an eviction during the copy would come back on the
  // target); they are evicted once the move is over, if still idle.

  // The slots in a state other than stable, as maximal runs in slot order.
  std::vector<SlotMove> SlotMoves() const { return ownership_.SlotMoves(); }

  // Sets slots [low, high] to `state` with `peer`, after every write in flight on
  // them has finished (it takes their gates exclusively), and makes it durable in
  // the data directory's kSlotMovesFileName before it takes effect (memory only without
  // one). Setting a slot to the state and peer it has is OK and changes nothing.
  // FAILED_PRECONDITION without a slot map, for migrating a slot this replica does
  // not own or importing one it owns, and for a slot in another state or with
  // another peer (stable is always allowed); INVALID_ARGUMENT for a range outside
  // [0, kSlotCount) or LOW above HIGH, and for a peer that is not a replica name or
  // is this replica; the file's error (UNAVAILABLE), which changes nothing.
  absl::Status SetSlotState(int low, int high, SlotMoveState state, absl::string_view peer) {
    return ownership_.SetSlotState(low, high, state, peer);
  }

  // What a move copies out of slots [low, high], owned or not, of every tenant: the
  // sessions' keys (read each with SessionRecord, whole under its lock) and the
  // scale groups' creation records, in key order. INVALID_ARGUMENT for a bad range.
  absl::StatusOr<std::vector<SessionKey>> SlotSessionKeys(int low, int high) const {
    return migration_.SlotSessionKeys(low, high);
  }
  absl::StatusOr<std::vector<SlotRecord>> SlotGroupRecords(int low, int high) const {
    return migration_.SlotGroupRecords(low, high);
  }
  // The session's whole persisted state as a `put` record; NOT_FOUND once it is gone.
  absl::StatusOr<SlotRecord> SessionRecord(const SessionKey& key) const {
    return migration_.SessionRecord(key);
  }

  // Takes records a move copied (`put` and `group_create`) into slots this replica is
  // importing and does not own yet, each journaled in order, then all synced once (a
  // batch costs one fsync under kAlways); each replaces a session or group of the
  // same key, so a copy started again is idempotent. The first failure ends it,
  // naming records[i], after syncing the ones before it (which stay imported):
  // INVALID_ARGUMENT for another kind of record or one that does not restore,
  // FAILED_PRECONDITION for a slot this replica is not importing or already owns,
  // RESOURCE_EXHAUSTED at max_sessions, the journal's error. Bytes that are not a
  // record are INVALID_ARGUMENT ("records[i] is not a storage record") before any
  // is imported. Returns how many sessions and groups it took.
  absl::StatusOr<SlotImport> Import(const std::vector<SlotRecord>& records) {
    return migration_.Import(records);
  }

  // Deletes (journaled) every session and scale group of slots [low, high], of every
  // tenant: a move's source once the target owns them, the target when a move is
  // rolled back or before it copies. FAILED_PRECONDITION if this replica owns any
  // of the slots (its sessions there are the live ones), or has no slot map;
  // INVALID_ARGUMENT for a bad range; the journal's first error (what was deleted
  // before it stays deleted). The sessions' deletions are synced once.
  absl::StatusOr<SlotDrop> DropSlots(int low, int high) { return migration_.DropSlots(low, high); }

  // OK if a call addressed to `replica` (a client's x-qparams-replica) is for this
  // replica; else FAILED_PRECONDITION naming both, which a balancer that routed it
  // to the wrong replica, or a client pointed straight at one replica, gets instead
  // of another replica's answer.
  absl::Status CheckAddressedTo(absl::string_view replica) const {
    return ownership_.CheckAddressedTo(replica);
  }

  // The replica this engine is and the slot map it serves now; null and "" without
  // sharding. The map is a snapshot: SetSlotMap may replace it right after.
  // Thread-safe.
  std::shared_ptr<const SlotMap> slot_map() const { return ownership_.slot_map(); }
  const std::string& replica_id() const { return ownership_.replica_id(); }

  // Replaces the slot map while serving (Redis Cluster's config epochs decide):
  // a map of a greater epoch than the current one is taken; one of the same epoch
  // and the same owners is a no-op (OK); an older one, or one of the same epoch
  // with other owners, is FAILED_PRECONDITION naming both epochs, as is any map on
  // an engine without sharding (no replica_id); null is INVALID_ARGUMENT. The map
  // may give this replica no slot. With a data directory the map is persisted first
  // (kSlotMapFileName, atomically through the Env) and a failure to write it is the
  // Env's error, with the old map still in force. Thread-safe; calls are
  // serialized. Returns once every session call that checked ownership against the
  // former map has finished (each holds the map for its whole length), so that no
  // call admitted under the old map mutates a slot after this returns; the change is
  // logged.
  absl::Status SetSlotMap(std::shared_ptr<const SlotMap> map) {
    return ownership_.SetSlotMap(std::move(map));
  }

 private:
  friend class EngineRecords;  // recovery.h: the stores' records

  // Not yet serving: idle eviction waits for StartEviction.
  Engine(EngineOptions options, std::unique_ptr<SessionLog> log);
  // With a session_ttl, the background thread that evicts idle sessions.
  void StartEviction();

  // The session `name` of `tenant`, once the admission's CheckOwned passes.
  absl::StatusOr<std::shared_ptr<Session>> Find(const SlotOwnership::ReadAdmission& admission,
                                                absl::string_view tenant) const;
  // The step timer's callback: closes the session's steps up to `step` if its slot
  // takes writes (else tries again after `timeout`), then arms its next open step.
  void ExpireStep(const SessionKey& key, int64_t step, absl::Duration timeout);
  void ArmFirstPending(const SessionKey& key, Session& session, absl::Duration timeout);

  const EngineOptions options_;
  // Every lock of the slot map and the move gates is its (slot_ownership.h).
  SlotOwnership ownership_;
  // Before the stores, whose sessions append to it: it outlives them.
  const std::unique_ptr<SessionLog> log_;
  SessionStore store_;
  ScaleGroupStore groups_;
  SlotMigration migration_;
  absl::Notification stop_;
  std::thread evictor_;
  // Last, so that it stops (and its callbacks into the engine end) first.
  std::unique_ptr<StepTimer> step_timer_;
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_ENGINE_H_
