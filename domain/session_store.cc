#include "domain/session_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/timestamp.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

constexpr size_t kMaxNameLength = 128;
// Evictions remembered for their NOT_FOUND message; older ones are forgotten.

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/' || c == '{' || c == '}';
}

absl::Status NotFound(const SessionKey& key) {
  return absl::NotFoundError(absl::StrCat("session \"", key.name, "\" does not exist"));
}

absl::Status Evicted(const SessionKey& key, absl::Time when) {
  return absl::NotFoundError(
      absl::StrCat("session \"", key.name, "\" was evicted at ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", when, absl::UTCTimeZone()),
                   " after being idle longer than --session_ttl; create it again"));
}

}  // namespace

absl::Status ValidateSessionName(absl::string_view name, absl::string_view field) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is empty; a session name is 1 to ", kMaxNameLength, " characters"));
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", name.size(), " characters; the limit is ", kMaxNameLength));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " has a character outside [a-zA-Z0-9._-/{}] at position ", i));
    }
  }
  return absl::OkStatus();
}

std::string SessionStore::MapKey(const SessionKey& key) {
  return absl::StrCat(key.tenant, std::string(1, '\0'), key.name);
}

void SessionStore::Insert(const std::string& map_key, std::shared_ptr<Session> session) {
  const bool inserted = sessions_.insert_or_assign(map_key, std::move(session)).second;
  if (inserted) ++tenant_sessions_[map_key.substr(0, map_key.find('\0'))];
}

void SessionStore::EraseKey(const std::string& map_key) {
  if (sessions_.erase(map_key) > 0) --tenant_sessions_[map_key.substr(0, map_key.find('\0'))];
}

std::vector<std::pair<std::string, int64_t>> SessionStore::SessionsPerTenant() const {
  absl::ReaderMutexLock lock(&mu_);
  return {tenant_sessions_.begin(), tenant_sessions_.end()};
}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::Create(
    SessionKey key, std::unique_ptr<StatefulQParamsCalculatorBase> calculator) {
  const absl::Time now = absl::Now();
  const CalculatorState state = calculator->ExportState();  // for the log, outside the lock
  auto session = std::make_shared<Session>(key, std::move(calculator), log_, now, now);
  std::string map_key = MapKey(key);
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    if (sessions_.contains(map_key)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "session \"", key.name, "\" already exists; delete it first or pick another name"));
    }
    if (static_cast<int64_t>(sessions_.size()) >= max_sessions_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the server holds ", sessions_.size(),
                       " sessions, its limit (--max_sessions); delete unused sessions first"));
    }
    QPARAMS_ASSIGN_OR_RETURN(sequence,
                             log_.AppendPut(key, state, now, now, DedupeWindow(), std::nullopt));
    Forget(map_key);
    Insert(map_key, session);
  }
  QPARAMS_RETURN_IF_ERROR(log_.Sync(sequence));
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::Find(const SessionKey& key) const {
  const std::string map_key = MapKey(key);
  absl::ReaderMutexLock lock(&mu_);
  auto it = sessions_.find(map_key);
  if (it != sessions_.end()) return it->second;
  if (auto e = evicted_.find(map_key); e != evicted_.end()) return Evicted(key, e->second);
  return NotFound(key);
}

absl::Status SessionStore::Remove(const std::shared_ptr<Session>& session,
                                  std::optional<absl::Time> evicted_at) {
  QPARAMS_ASSIGN_OR_RETURN(const uint64_t sequence, RemoveUnsynced(session, evicted_at));
  return log_.Sync(sequence);
}

absl::StatusOr<uint64_t> SessionStore::RemoveUnsynced(const std::shared_ptr<Session>& session,
                                                      std::optional<absl::Time> evicted_at) {
  uint64_t sequence = 0;
  absl::Status gone =
      evicted_at.has_value()
          ? Evicted(session->key(), *evicted_at)
          : absl::NotFoundError(absl::StrCat("session \"", session->name(), "\" was deleted"));
  QPARAMS_RETURN_IF_ERROR(session->Retire(
      [&]() -> absl::Status {
        absl::MutexLock lock(&mu_);
        QPARAMS_ASSIGN_OR_RETURN(sequence, evicted_at.has_value()
                                               ? log_.AppendEviction(session->key(), *evicted_at)
                                               : log_.AppendErase(session->key()));
        const std::string map_key = MapKey(session->key());
        EraseKey(map_key);
        if (evicted_at.has_value()) Remember(map_key, *evicted_at);
        return absl::OkStatus();
      },
      gone));
  return sequence;
}

void SessionStore::Remember(std::string map_key, absl::Time evict_time) {
  Forget(map_key);
  eviction_order_.emplace(evict_time, map_key);
  evicted_.emplace(std::move(map_key), evict_time);
  while (evicted_.size() > max_remembered_evictions_) {
    auto oldest = eviction_order_.begin();
    evicted_.erase(oldest->second);
    eviction_order_.erase(oldest);
  }
}

void SessionStore::Forget(const std::string& map_key) {
  auto it = evicted_.find(map_key);
  if (it == evicted_.end()) return;
  eviction_order_.erase({it->second, map_key});
  evicted_.erase(it);
}

absl::Status SessionStore::Erase(const SessionKey& key) {
  QPARAMS_ASSIGN_OR_RETURN(const std::shared_ptr<Session> session, Find(key));
  absl::Status status = Remove(session, /*evicted_at=*/std::nullopt);
  // Retired meanwhile by another call: to this caller the session does not exist.
  if (absl::IsNotFound(status)) return NotFound(key);
  return status;
}

std::vector<std::shared_ptr<Session>> SessionStore::IdleSessions(absl::Time idle_since) const {
  std::vector<std::shared_ptr<Session>> idle;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [map_key, session] : sessions_) {
    if (session->last_access() < idle_since) idle.push_back(session);
  }
  return idle;
}

bool SessionStore::EvictIfIdle(const std::shared_ptr<Session>& session, absl::Time idle_since) {
  // A call that named the session since the scan keeps it.
  if (session->last_access() >= idle_since) return false;
  return Remove(session, /*evicted_at=*/absl::Now()).ok();
}

SessionStore::Page SessionStore::List(absl::string_view tenant, absl::string_view prefix,
                                      absl::string_view after, int limit,
                                      const std::function<bool(absl::string_view)>& keep) const {
  Page page;
  const std::string start = MapKey({std::string(tenant), std::string(prefix)});
  const std::string resume = MapKey({std::string(tenant), std::string(after)});
  absl::ReaderMutexLock lock(&mu_);
  auto it = after.empty() || resume < start ? sessions_.lower_bound(start)
                                            : sessions_.upper_bound(resume);
  for (; it != sessions_.end() && absl::StartsWith(it->first, start); ++it) {
    if (keep != nullptr && !keep(it->second->name())) continue;
    if (static_cast<int>(page.sessions.size()) == limit) {
      page.more = true;
      break;
    }
    page.sessions.push_back(it->second);
  }
  return page;
}

absl::Status SessionStore::EmitRecords(const Journal::Emitter& emit) const {
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<storage::v1::Record> evictions;
  {
    absl::ReaderMutexLock lock(&mu_);
    sessions.reserve(sessions_.size());
    for (const auto& [map_key, session] : sessions_) sessions.push_back(session);
    for (const auto& [when, map_key] : eviction_order_) {
      const size_t split = map_key.find('\0');
      evictions.push_back(
          EncodeEviction({map_key.substr(0, split), map_key.substr(split + 1)}, when));
    }
  }
  for (const storage::v1::Record& record : evictions) QPARAMS_RETURN_IF_ERROR(emit(record));
  storage::v1::Record record;
  for (const std::shared_ptr<Session>& session : sessions) {
    *record.mutable_put() = session->Record();
    QPARAMS_RETURN_IF_ERROR(emit(record));
  }
  return absl::OkStatus();
}

std::vector<storage::v1::Record> SessionStore::Records() const {
  std::vector<storage::v1::Record> records;
  EmitRecords([&](const storage::v1::Record& record) {
    records.push_back(record);
    return absl::OkStatus();
  }).IgnoreError();  // the emitter never fails
  return records;
}

std::optional<std::string> SessionStore::Replay(const storage::v1::Record& record) {
  switch (record.kind_case()) {
    case storage::v1::Record::kPut: {
      const std::string key = MapKey(DecodeKey(record.put().key()));
      std::optional<std::string> problem;
      std::shared_ptr<Session> session;
      if (absl::Status name = ValidateSessionName(record.put().key().name(), "session name");
          !name.ok()) {
        problem = absl::StrCat("skipped a record of an invalid ", name.message());
      } else if (absl::StatusOr<DecodedSession> decoded = DecodeSession(record.put());
                 !decoded.ok()) {
        problem =
            absl::StrCat("skipped a record that does not restore: ", decoded.status().message());
      } else {
        // The record's temporaries are gone: the buffers move out of their gaps.
        decoded->calculator->ReallocateBuffers();
        session = std::make_shared<Session>(std::move(decoded->key), std::move(decoded->calculator),
                                            log_, decoded->create_time, decoded->update_time,
                                            std::move(decoded->dedupe), std::move(decoded->steps));
      }
      absl::MutexLock lock(&mu_);
      Forget(key);
      if (session != nullptr) {
        Insert(key, std::move(session));
      } else {
        EraseKey(key);
      }
      return problem;
    }
    case storage::v1::Record::kContributed: {
      absl::StatusOr<DecodedContribution> decoded = DecodeContribution(record.contributed());
      if (!decoded.ok()) {
        return absl::StrCat("skipped a step contribution that does not decode: ",
                            decoded.status().message());
      }
      absl::StatusOr<std::shared_ptr<Session>> session = Find(decoded->key);
      if (!session.ok()) {
        return absl::StrCat("skipped a step contribution to session ", decoded->key.name,
                            ", which no record before it holds");
      }
      if (absl::Status replayed =
              (*session)->ReplayContribution(decoded->contribution, decoded->update_time);
          !replayed.ok()) {
        return absl::StrCat("skipped a step contribution to session ", decoded->key.name, ": ",
                            replayed.message());
      }
      return std::nullopt;
    }
    case storage::v1::Record::kErase: {
      const std::string key = MapKey(DecodeKey(record.erase()));
      absl::MutexLock lock(&mu_);
      EraseKey(key);
      return std::nullopt;
    }
    case storage::v1::Record::kEvicted: {
      std::string key = MapKey(DecodeKey(record.evicted().key()));
      absl::MutexLock lock(&mu_);
      EraseKey(key);
      Remember(std::move(key), TimeFromTimestamp(record.evicted().evict_time()));
      return std::nullopt;
    }
    case storage::v1::Record::kGroupCreate:
    case storage::v1::Record::kGroupDelete:  // the scale groups' (ScaleGroupStore::Replay)
    case storage::v1::Record::KIND_NOT_SET:
      break;
  }
  return std::nullopt;
}

std::vector<std::string> SessionStore::Restore(const std::vector<storage::v1::Record>& records) {
  std::vector<std::string> problems;
  for (const storage::v1::Record& record : records) {
    if (std::optional<std::string> problem = Replay(record)) {
      problems.push_back(*std::move(problem));
    }
  }
  return problems;
}

absl::StatusOr<uint64_t> SessionStore::Import(const storage::v1::SessionState& record) {
  QPARAMS_RETURN_IF_ERROR(ValidateSessionName(record.key().name(), "session name"));
  absl::StatusOr<DecodedSession> decoded = DecodeSession(record);
  if (!decoded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a record that does not restore: ", decoded.status().message()));
  }
  decoded->calculator->ReallocateBuffers();
  const CalculatorState state = decoded->calculator->ExportState();  // outside the lock
  const SessionKey key = decoded->key;
  std::optional<StepState> steps;
  if (decoded->steps.has_value()) steps = decoded->steps->ExportState();
  // The dedupe window and the steps travel with the session: a retry of an
  // observation or a contribution the source applied is answered here as a duplicate.
  auto session =
      std::make_shared<Session>(key, std::move(decoded->calculator), log_, decoded->create_time,
                                decoded->update_time, decoded->dedupe, std::move(decoded->steps));
  const std::string map_key = MapKey(key);
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!sessions_.contains(map_key) && static_cast<int64_t>(sessions_.size()) >= max_sessions_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server holds ", sessions_.size(),
          " sessions, its limit (--max_sessions); session \"", key.name, "\" cannot be imported"));
    }
    QPARAMS_ASSIGN_OR_RETURN(sequence,
                             log_.AppendPut(key, state, decoded->create_time, decoded->update_time,
                                            decoded->dedupe, steps));
    Forget(map_key);
    Insert(map_key, std::move(session));
  }
  return sequence;
}

absl::StatusOr<int64_t> SessionStore::EraseAll(const std::vector<SessionKey>& keys) {
  int64_t erased = 0;
  uint64_t sequence = 0;
  absl::Status status;
  for (const SessionKey& key : keys) {
    absl::StatusOr<std::shared_ptr<Session>> session = Find(key);
    if (!session.ok()) continue;  // gone already
    absl::StatusOr<uint64_t> removed = RemoveUnsynced(*session, /*evicted_at=*/std::nullopt);
    if (absl::IsNotFound(removed.status())) continue;  // retired meanwhile
    if (!removed.ok()) {
      status = removed.status();
      break;
    }
    sequence = *removed;
    ++erased;
  }
  const absl::Status synced = log_.Sync(sequence);
  if (!status.ok()) return status;
  if (!synced.ok()) return synced;
  return erased;
}

std::vector<SessionKey> SessionStore::KeysWhere(
    const std::function<bool(absl::string_view)>& keep) const {
  std::vector<SessionKey> keys;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [map_key, session] : sessions_) {
    if (keep(session->name())) keys.push_back(session->key());
  }
  return keys;
}

int64_t SessionStore::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace qparams
