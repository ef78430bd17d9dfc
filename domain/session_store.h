// The sessions of a server, by tenant and name: a thread-safe ordered map with a
// size limit, journaling creations, deletions and evictions. Lookups and listing
// take a shared lock on the map only; work on a session takes that session's own
// lock, so different sessions proceed in parallel.
//
// Lock order: a session's lock, then the map's (Retire runs the removal under the
// session's lock, so no mutation of the session can be journaled after its erasure).

#ifndef QPARAMS_DOMAIN_SESSION_STORE_H_
#define QPARAMS_DOMAIN_SESSION_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "domain/session.h"
#include "qparams/storage/v1/storage.pb.h"
#include "storage/journal.h"
#include "storage/session_log.h"

namespace qparams {

// A session name is 1 to 128 characters of [a-zA-Z0-9._-/]. INVALID_ARGUMENT
// naming `field` otherwise.
absl::Status ValidateSessionName(absl::string_view name, absl::string_view field = "name");

class SessionStore {
 public:
  // How many evicted names the store remembers (to say why a session is gone),
  // forgetting the oldest eviction first.
  static constexpr size_t kDefaultMaxRememberedEvictions = 100000;

  // Creations, deletions and evictions are appended to `log` (a NullSessionLog when
  // nothing is persisted), which must outlive the store and its sessions.
  SessionStore(int64_t max_sessions, SessionLog& log,
               size_t max_remembered_evictions = kDefaultMaxRememberedEvictions)
      : max_sessions_(max_sessions),
        max_remembered_evictions_(max_remembered_evictions),
        log_(log) {}

  // Adds a new session: ALREADY_EXISTS if the key is taken, RESOURCE_EXHAUSTED if
  // the store holds max_sessions already, or the session log's error.
  absl::StatusOr<std::shared_ptr<Session>> Create(
      SessionKey key, std::unique_ptr<StatefulQParamsCalculatorBase> calculator);

  // The session, or NOT_FOUND (saying so if it was evicted after being idle).
  absl::StatusOr<std::shared_ptr<Session>> Find(const SessionKey& key) const;

  // Removes the session (NOT_FOUND if absent); references still held elsewhere then
  // answer NOT_FOUND too.
  absl::Status Erase(const SessionKey& key);

  // The sessions no call has named since `idle_since`, for a caller that decides
  // about each (EvictIfIdle) under locks of its own.
  std::vector<std::shared_ptr<Session>> IdleSessions(absl::Time idle_since) const;
  // Evicts `session` unless a call has named it since `idle_since` or it is gone;
  // whether it did.
  bool EvictIfIdle(const std::shared_ptr<Session>& session, absl::Time idle_since);

  // Up to `limit` sessions of `tenant` whose names start with `prefix`, sort after
  // `after` (byte order) and pass `keep` (if given; called under the store's reader
  // lock, so it must not call back into the store), and whether more follow.
  struct Page {
    std::vector<std::shared_ptr<Session>> sessions;
    bool more = false;
  };
  Page List(absl::string_view tenant, absl::string_view prefix, absl::string_view after, int limit,
            const std::function<bool(absl::string_view name)>& keep = nullptr) const;

  // The live state as records, for a snapshot, one at a time through `emit`: every
  // eviction still remembered (oldest first), then every session in key order. Stops
  // at emit's first error and returns it. Sessions created meanwhile may be left out.
  absl::Status EmitRecords(const Journal::Emitter& emit) const;
  // The same, collected.
  std::vector<storage::v1::Record> Records() const;

  // Applies one journal/snapshot record, without journaling it: the last record of a
  // key wins. A put that does not decode (or names an invalid name) leaves the key
  // without a session and returns the problem. A scale group's record is not the
  // store's: nothing (Engine::Replay gives it to the ScaleGroupStore).
  std::optional<std::string> Replay(const storage::v1::Record& record);
  // Replays `records` in order; returns the problems met.
  std::vector<std::string> Restore(const std::vector<storage::v1::Record>& records);

  // A session's whole state taken from another replica (a slot move): decoded as
  // Replay decodes it and journaled (AppendPut), replacing a session of the same key,
  // so that importing the same record again changes nothing. Not synced: returns the
  // record's sequence number, for the caller to Sync once for many imports.
  // INVALID_ARGUMENT for a record that does not restore, RESOURCE_EXHAUSTED for a new
  // key at max_sessions, or the log's error, which imports nothing.
  absl::StatusOr<uint64_t> Import(const storage::v1::SessionState& record);

  // Erases each of `keys` there is (journaled, as Erase), then syncs the log once:
  // how many were erased, or the log's first error (those before it stay erased).
  absl::StatusOr<int64_t> EraseAll(const std::vector<SessionKey>& keys);

  // The keys of every session (all tenants) whose name passes `keep` (called under
  // the store's reader lock, as List's), in key order.
  std::vector<SessionKey> KeysWhere(const std::function<bool(absl::string_view name)>& keep) const;

  int64_t size() const;

  // How many sessions each tenant holds ("" when authentication is off), in tenant
  // order; a tenant whose sessions are all gone stays, at 0. Counted as sessions come
  // and go, so this costs one pass over the tenants, not over the sessions.
  std::vector<std::pair<std::string, int64_t>> SessionsPerTenant() const;

 private:
  // The map key: tenant and name joined by a byte no name holds, so a tenant's
  // sessions are contiguous and in name order.
  static std::string MapKey(const SessionKey& key);
  // Every change to sessions_ goes through these two, which keep tenant_sessions_.
  void Insert(const std::string& map_key, std::shared_ptr<Session> session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseKey(const std::string& map_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retires `session` and logs why: its eviction at `evicted_at`, else its erasure;
  // synced (Remove) or not, returning the record's sequence number (RemoveUnsynced).
  absl::Status Remove(const std::shared_ptr<Session>& session,
                      std::optional<absl::Time> evicted_at) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> RemoveUnsynced(const std::shared_ptr<Session>& session,
                                          std::optional<absl::Time> evicted_at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Remembers an eviction, forgetting the oldest beyond the bound; Forget drops one.
  void Remember(std::string map_key, absl::Time evict_time) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const std::string& map_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_sessions_;
  const size_t max_remembered_evictions_;
  SessionLog& log_;
  mutable absl::Mutex mu_;
  absl::btree_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<std::string, int64_t> tenant_sessions_ ABSL_GUARDED_BY(mu_);
  // Evicted keys, so a later call can say why the session is gone: by key, and in
  // eviction order (time, then key) to forget the oldest first.
  absl::flat_hash_map<std::string, absl::Time> evicted_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::pair<absl::Time, std::string>> eviction_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SESSION_STORE_H_
