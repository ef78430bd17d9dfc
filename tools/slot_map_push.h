// Pushing a new slot map to a running sharded deployment (docs/sharding.md,
// "Changing the topology"): every replica first (SetSlotMap, each addressed by
// name), then every HAProxy (its runtime API, tools/haproxy_runtime.h). In that
// order, so that while HAProxy still routes by the old map, the old owner already
// refuses a moved slot naming the new one and clients follow the refusal; once
// HAProxy has the new map, calls go straight to the new owner.
//
// Target qparams_topology (tools/README.md), beside qparams_client: `qparams-cli
// slotmap push` and resharding build on it. Thread-compatible.

#ifndef QPARAMS_TOOLS_SLOT_MAP_PUSH_H_
#define QPARAMS_TOOLS_SLOT_MAP_PUSH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/slot_map.h"
#include "qparams/client.h"

namespace qparams {

// Where one replica is reached: through the balancer (`target` "") addressed by
// name, or straight at `target` (HOST:PORT), addressed by name all the same, so that
// a wrong address is refused rather than given the map.
struct ReplicaEndpoint {
  std::string replica;
  std::string target;  // "" = the balancer's (PushOptions::target)
};

// A spare HAProxy backend's server to point at a new replica (HaproxyRuntime::SetServer)
// before the map goes in: backend and server are both named `backend` (haproxy.cfg).
struct HaproxyServer {
  std::string backend;  // r3
  std::string host;
  int port = 0;
  int check_port = 0;  // 0: unchanged
};

struct PushOptions {
  // The balancer (or any replica) the replicas without their own target are reached
  // through, and that names the current replicas when `replicas` is empty.
  std::string target;
  // The client settings of every call (timeout, TLS, token: an admin token where the
  // servers have tokens); `replica` is set per call.
  ClientOptions client;
  // The replicas to give the map; empty: every replica the new map names, every
  // replica of the current topology and the replica that answered it (GetTopology
  // through `target`), so that a replica the map no longer names learns that it
  // owns nothing.
  std::vector<ReplicaEndpoint> replicas;
  // HAProxy runtime API addresses (UNIX socket paths or HOST:PORT) whose map is
  // replaced after the replicas; empty: none.
  std::vector<std::string> haproxy_admins;
  // Spare backends to make ready (address, check port) on every HAProxy, before the
  // replicas are given the map (a backend no map names routes nothing but calls
  // addressed to it, such as the push to its new replica, which waits up to
  // haproxy_timeout for HAProxy's first health check of it to pass).
  std::vector<HaproxyServer> haproxy_servers;
  // The map's name in HAProxy (the file name it loaded it from); "": the only map
  // HAProxy has (FAILED_PRECONDITION if it has none or several).
  std::string haproxy_map;
  absl::Duration haproxy_timeout = absl::Seconds(10);
};

// What happened at each place, in order.
struct PushReport {
  struct Replica {
    std::string replica;
    absl::Status status;  // SetSlotMap's
    int64_t epoch = -1;   // the replica's epoch after it, when it answered
  };
  struct Haproxy {
    std::string admin;
    std::string map;  // the map replaced ("" if not found)
    absl::Status status;  // of the servers set, then of the map
  };
  std::vector<Replica> replicas;
  std::vector<Haproxy> haproxies;
  // OK if every replica and HAProxy took the map; else the first failure.
  absl::Status status() const;
};

// Gives `map` to the replicas, then to HAProxy, as PushOptions says. A replica that
// refuses (an older epoch, an admin token missing) or cannot be reached does not
// stop the others, and HAProxy is not touched when any replica failed (its map must
// not run ahead of the replicas'): rerun after fixing, as the same map again is a
// no-op everywhere. The returned error is for what prevents any push: INVALID_ARGUMENT
// for bad options, GetTopology's error when the replicas are to be found from it.
absl::StatusOr<PushReport> PushSlotMap(const SlotMap& map, const PushOptions& options);

// Replaces the slot map of each HAProxy runtime API address of `admins` by `map`, as
// PushSlotMap does once every replica took it: the map named `map_name` in HAProxy,
// or its only one when "". For a caller that gives the replicas the map itself, in
// an order of its own (reshard: the target, then the source). The first failure,
// naming the address; the HAProxies before it took the map.
absl::Status PushSlotMapToHaproxy(const SlotMap& map, const std::vector<std::string>& admins,
                                  const std::string& map_name,
                                  absl::Duration timeout = absl::Seconds(10));

}  // namespace qparams

#endif  // QPARAMS_TOOLS_SLOT_MAP_PUSH_H_
