// A small client of HAProxy's runtime API (the `stats socket ... level admin` of
// docker/haproxy/haproxy.cfg; HAProxy 2.6): one text command per connection, the
// answer read to the end. What a topology change needs without a reload: replacing
// the slot map HAProxy routes with (`map_int`), atomically, and pointing a spare
// backend's server at a new replica.
//
// The admin address is a UNIX socket path ("/run/haproxy/admin.sock", or
// "unix:PATH") or "HOST:PORT" for a TCP socket ("ipv4@127.0.0.1:9999" in haproxy.cfg).
// Errors: UNAVAILABLE when the socket cannot be reached, DEADLINE_EXCEEDED when
// HAProxy does not answer within the timeout, FAILED_PRECONDITION carrying
// HAProxy's own message when it refuses a command. Thread-safe (no shared state).
//
// Target qparams_haproxy (tools/README.md); qparams-cli's `slotmap push` and the
// resharding commands build on it.

#ifndef QPARAMS_TOOLS_HAPROXY_RUNTIME_H_
#define QPARAMS_TOOLS_HAPROXY_RUNTIME_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/slot_map.h"

namespace qparams {

// The backend of haproxy.cfg whose servers, one per replica, serve the calls that
// name no session (GetTopology, Compute, health).
inline constexpr char kPoolBackend[] = "any";

class HaproxyRuntime {
 public:
  // One entry of a map as `show map MAP` lists it.
  struct MapEntry {
    std::string key;    // "0:84" for a map_int range
    std::string value;  // the backend's name
  };

  // `admin`: the socket's address (see above); INVALID_ARGUMENT if it is empty or
  // neither a path nor HOST:PORT. Connects at each command, not now.
  static absl::StatusOr<HaproxyRuntime> Create(const std::string& admin,
                                               absl::Duration timeout = absl::Seconds(10));

  // Sends `command` (one line, no newline) and returns HAProxy's whole answer.
  absl::StatusOr<std::string> Command(absl::string_view command) const;

  // The maps HAProxy has loaded, by the file name they were loaded from (`show map`).
  absl::StatusOr<std::vector<std::string>> ListMaps() const;
  // The entries of `map` (a file name of ListMaps, or "#ID"), in HAProxy's order.
  absl::StatusOr<std::vector<MapEntry>> ShowMap(const std::string& map) const;

  // Replaces every entry of `map` by the ranges of `slot_map` ("LOW:HIGH REPLICA"),
  // atomically: a new version of the map is prepared, filled and committed
  // (`prepare map`, `add map @VERSION`, `commit map @VERSION`), so lookups see the
  // old entries or the new ones, never a mix; then checks that `show map` lists
  // exactly the new ones. HAProxy keeps the file on disk as it was: update the file
  // too, for HAProxy's next start. On a failure before the commit the map is as it
  // was.
  absl::Status ReplaceMap(const std::string& map, const SlotMap& slot_map) const;

  // Points `backend`/`server` at HOST:PORT, its health check at `check_port` (0:
  // unchanged) and makes it ready (`set server ... addr`, `check-port`,
  // `state ready`): a spare backend taking a new replica, without a reload. The
  // server of the same name in the pool that serves calls naming no session
  // (kPoolBackend; it tracks `backend`/`server`'s health) is pointed there first.
  absl::Status SetServer(const std::string& backend, const std::string& server,
                         const std::string& host, int port, int check_port = 0) const;
  // Puts `backend`/`server` in maintenance (`set server ... state maint`): a
  // spare backend given up by a removed replica.
  absl::Status DisableServer(const std::string& backend, const std::string& server) const;

 private:
  HaproxyRuntime(std::string admin, bool unix_socket, absl::Duration timeout)
      : admin_(std::move(admin)), unix_socket_(unix_socket), timeout_(timeout) {}

  // Sends `command` on the connected socket `fd` and reads the answer to its end.
  absl::StatusOr<std::string> Exchange(int fd, absl::string_view command) const;

  std::string admin_;  // a path, or HOST:PORT
  bool unix_socket_;
  absl::Duration timeout_;
};

}  // namespace qparams

#endif  // QPARAMS_TOOLS_HAPROXY_RUNTIME_H_
