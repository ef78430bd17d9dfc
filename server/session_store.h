// The sessions of a server, by name: a thread-safe ordered map with a size limit.
// Lookups and listing take a shared lock on the map only; work on a session takes
// that session's own lock, so different sessions proceed in parallel.

#ifndef QPARAMS_SERVER_SESSION_STORE_H_
#define QPARAMS_SERVER_SESSION_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/session.h"

namespace qparams {

// A session name is 1 to 128 characters of [a-zA-Z0-9._-/]. INVALID_ARGUMENT
// naming `field` otherwise.
absl::Status ValidateSessionName(absl::string_view name, absl::string_view field = "name");

class SessionStore {
 public:
  explicit SessionStore(int64_t max_sessions) : max_sessions_(max_sessions) {}

  // Adds a session under its name: ALREADY_EXISTS if the name is taken,
  // RESOURCE_EXHAUSTED if the store holds max_sessions already.
  absl::StatusOr<std::shared_ptr<Session>> Insert(std::unique_ptr<Session> session);

  // The session named `name`, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Session>> Find(absl::string_view name) const;

  // Removes the session named `name` (NOT_FOUND if absent); references still held
  // elsewhere then answer NOT_FOUND too.
  absl::Status Erase(absl::string_view name);

  // Up to `limit` sessions whose names start with `prefix` and sort after `after`
  // (byte order), and whether more follow.
  struct Page {
    std::vector<std::shared_ptr<Session>> sessions;
    bool more = false;
  };
  Page List(absl::string_view prefix, absl::string_view after, int limit) const;

  int64_t size() const;

 private:
  const int64_t max_sessions_;
  mutable absl::Mutex mu_;
  absl::btree_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_SESSION_STORE_H_
