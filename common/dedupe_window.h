// Idempotency keys of observations and the dedupe window a session keeps of them, so
// that a retried observation is applied at most once (docs/retries.md).
//
// A key is a client-chosen id and a sequence number the client increases per
// session. The window remembers, for the kMaxClients client ids that most recently
// applied an observation to the session, the kSequencesPerClient highest sequences
// each applied and the session's observation count after each. It is plain data with
// its rules and no I/O: the session keeps it beside its calculator and persists it in
// the same record (storage/session_codec.h), so it survives restarts and moves.

#ifndef QPARAMS_COMMON_DEDUPE_WINDOW_H_
#define QPARAMS_COMMON_DEDUPE_WINDOW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace qparams {

// An observation's idempotency key.
struct ObserveKey {
  std::string client_id;
  uint64_t sequence = 0;
};

inline constexpr int kMaxClientIdLength = 64;

// OK for a key whose client_id is 1..kMaxClientIdLength characters of [A-Za-z0-9._-]
// and whose sequence is >= 1; else INVALID_ARGUMENT naming the field and the rule.
absl::Status ValidateObserveKey(const ObserveKey& key);

// Not thread-safe: the session guards it with its own lock.
class DedupeWindow {
 public:
  static constexpr int kMaxClients = 64;
  static constexpr int kSequencesPerClient = 16;

  struct Applied {
    uint64_t sequence = 0;
    int64_t observation_count = 0;  // the session's count after it
  };
  struct Client {
    std::string id;
    std::vector<Applied> applied;  // ascending sequences, at most kSequencesPerClient
  };

  // The window of `clients` (least recently applied first), as a record holds it;
  // INVALID_ARGUMENT naming what breaks the window's rules (a bad id, a repeated
  // id, too many clients or sequences, sequences not ascending from >= 1).
  static absl::StatusOr<DedupeWindow> FromClients(std::vector<Client> clients);

  // What `key` (valid) means here: nullopt if it was never applied (apply it, then
  // Record it); the session's count after it if it was (answer it as a duplicate);
  // FAILED_PRECONDITION naming the sequence if it is older than everything the
  // window keeps of its client, which cannot tell whether it was applied.
  absl::StatusOr<std::optional<int64_t>> Check(const ObserveKey& key) const;

  // Remembers that `key` (which Check answered nullopt) was applied, leaving the
  // session at `observation_count`; its client becomes the most recent, and the
  // least recent client (or the client's lowest sequence) beyond the limits is
  // forgotten.
  void Record(const ObserveKey& key, int64_t observation_count);

  // Least recently applied first.
  const std::vector<Client>& clients() const { return clients_; }
  bool empty() const { return clients_.empty(); }

 private:
  const Client* Find(const std::string& id) const;

  std::vector<Client> clients_;
};

}  // namespace qparams

#endif  // QPARAMS_COMMON_DEDUPE_WINDOW_H_
