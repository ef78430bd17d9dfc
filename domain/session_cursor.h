// The sessions of a tenant whose names start with a prefix, in name order, read from
// the engine a page at a time: what the bulk reads (ReadSessions, exports) walk, in
// memory bounded by one page whatever the prefix matches.

#ifndef QPARAMS_DOMAIN_SESSION_CURSOR_H_
#define QPARAMS_DOMAIN_SESSION_CURSOR_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "domain/engine.h"

namespace qparams {

// Not thread-safe. Holds no snapshot: a session created or deleted while it walks may
// or may not appear; each one it returns was copied whole under its lock. The engine
// must outlive it.
class SessionCursor {
 public:
  static constexpr int kPage = 64;  // sessions read at a time

  // `prefix` must be "" or pass ValidateSessionName (Engine::ListSessions checks it
  // otherwise, and Next() returns its error).
  SessionCursor(const Engine* engine, std::string tenant, std::string prefix)
      : engine_(engine), tenant_(std::move(tenant)), prefix_(std::move(prefix)) {}

  // The next session, valid until the next call; null after the last. The errors of
  // Engine::ListSessions.
  absl::StatusOr<const SessionInfo*> Next();

 private:
  const Engine* const engine_;
  const std::string tenant_;
  const std::string prefix_;
  SessionPage page_;
  size_t next_ = 0;
  bool fetched_ = false;
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SESSION_CURSOR_H_
