#include "tools/slot_map_push.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tools/haproxy_runtime.h"

namespace qparams {

absl::Status PushReport::status() const {
  for (const Replica& r : replicas) {
    if (!r.status.ok()) {
      return absl::Status(r.status.code(),
                          absl::StrCat("replica ", r.replica, ": ", r.status.message()));
    }
  }
  for (const Haproxy& h : haproxies) {
    if (!h.status.ok()) {
      return absl::Status(h.status.code(),
                          absl::StrCat("HAProxy ", h.admin, ": ", h.status.message()));
    }
  }
  return absl::OkStatus();
}

namespace {

// The replicas to push to when none are given: the new map's and the current ones.
absl::StatusOr<std::vector<ReplicaEndpoint>> EveryReplica(const SlotMap& map,
                                                          const PushOptions& options) {
  std::set<std::string> names(map.replicas().begin(), map.replicas().end());
  ClientOptions client_options = options.client;
  client_options.replica.clear();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options.target, client_options);
  if (!client.ok()) return client.status();
  absl::StatusOr<v1::Topology> topology = (*client)->GetTopology();
  if (!topology.ok()) {
    return absl::Status(topology.status().code(),
                        absl::StrCat("the current replicas (GetTopology through ", options.target,
                                     "): ", topology.status().message()));
  }
  for (const std::string& replica : topology->replicas()) {
    if (!replica.empty()) names.insert(replica);
  }
  // The replica that answered, which owns no slot if the map gave them all away: it
  // still answers what HAProxy routes to it by default (GetTopology among them).
  if (!topology->replica_id().empty()) names.insert(topology->replica_id());
  std::vector<ReplicaEndpoint> replicas;
  for (const std::string& name : names) replicas.push_back({name, ""});
  return replicas;
}

// The map's name in HAProxy: `wanted`, or the only one it has.
absl::StatusOr<std::string> MapName(const HaproxyRuntime& haproxy, const std::string& wanted) {
  if (!wanted.empty()) return wanted;
  absl::StatusOr<std::vector<std::string>> maps = haproxy.ListMaps();
  if (!maps.ok()) return maps.status();
  if (maps->size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "HAProxy has ", maps->size(), " maps (", absl::StrJoin(*maps, ", "),
        "); name the slot map's (--haproxy_map)"));
  }
  return maps->front();
}

}  // namespace

absl::StatusOr<PushReport> PushSlotMap(const SlotMap& map, const PushOptions& options) {
  if (options.target.empty()) {
    const bool all_direct = !options.replicas.empty() &&
                            std::all_of(options.replicas.begin(), options.replicas.end(),
                                        [](const ReplicaEndpoint& r) { return !r.target.empty(); });
    if (!all_direct) return absl::InvalidArgumentError("the balancer's target is empty");
  }
  for (const ReplicaEndpoint& r : options.replicas) {
    if (!SlotMap::ValidReplicaName(r.replica)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica name \"", r.replica, "\" is not 1 to 64 characters of [a-zA-Z0-9._-]"));
    }
  }
  std::vector<HaproxyRuntime> haproxies;
  for (const std::string& admin : options.haproxy_admins) {
    absl::StatusOr<HaproxyRuntime> haproxy = HaproxyRuntime::Create(admin, options.haproxy_timeout);
    if (!haproxy.ok()) return haproxy.status();
    haproxies.push_back(*std::move(haproxy));
  }
  std::vector<ReplicaEndpoint> replicas = options.replicas;
  if (replicas.empty()) {
    absl::StatusOr<std::vector<ReplicaEndpoint>> every = EveryReplica(map, options);
    if (!every.ok()) return every.status();
    replicas = *std::move(every);
  }

  PushReport report;
  // Spares first: a backend made ready changes no routing until a map names it, and
  // the new replica's push below may go through it.
  std::vector<absl::Status> servers_set(haproxies.size());
  for (size_t i = 0; i < haproxies.size(); ++i) {
    for (const HaproxyServer& server : options.haproxy_servers) {
      servers_set[i] = haproxies[i].SetServer(server.backend, server.backend, server.host,
                                              server.port, server.check_port);
      if (!servers_set[i].ok()) break;
    }
  }
  const std::string text = map.ToText();
  for (const ReplicaEndpoint& endpoint : replicas) {
    PushReport::Replica& r = report.replicas.emplace_back();
    r.replica = endpoint.replica;
    ClientOptions client_options = options.client;
    client_options.replica = endpoint.replica;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(
        endpoint.target.empty() ? options.target : endpoint.target, client_options);
    if (!client.ok()) {
      r.status = client.status();
      continue;
    }
    // Through HAProxy, a spare backend just made ready is UNAVAILABLE until its
    // first health check passes (about a second): wait that long, not longer.
    const bool through_balancer = endpoint.target.empty() && !options.haproxy_servers.empty();
    const absl::Time deadline = absl::Now() + options.haproxy_timeout;
    absl::StatusOr<v1::Topology> topology = (*client)->SetSlotMap(text);
    while (through_balancer && topology.status().code() == absl::StatusCode::kUnavailable &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      topology = (*client)->SetSlotMap(text);
    }
    r.status = topology.status();
    if (topology.ok()) r.epoch = topology->epoch();
  }
  const bool replicas_ok =
      std::all_of(report.replicas.begin(), report.replicas.end(),
                  [](const PushReport::Replica& r) { return r.status.ok(); });
  for (size_t i = 0; i < haproxies.size(); ++i) {
    PushReport::Haproxy& h = report.haproxies.emplace_back();
    h.admin = options.haproxy_admins[i];
    if (!servers_set[i].ok()) {
      h.status = servers_set[i];
      continue;
    }
    if (!replicas_ok) {
      h.status = absl::FailedPreconditionError(
          "not changed: a replica did not take the map (HAProxy must not route by a map the "
          "replicas do not serve)");
      continue;
    }
    absl::StatusOr<std::string> name = MapName(haproxies[i], options.haproxy_map);
    if (!name.ok()) {
      h.status = name.status();
      continue;
    }
    h.map = *name;
    h.status = haproxies[i].ReplaceMap(*name, map);
  }
  return report;
}

absl::Status PushSlotMapToHaproxy(const SlotMap& map, const std::vector<std::string>& admins,
                                  const std::string& map_name, absl::Duration timeout) {
  for (const std::string& admin : admins) {
    absl::StatusOr<HaproxyRuntime> haproxy = HaproxyRuntime::Create(admin, timeout);
    absl::Status status = haproxy.status();
    if (status.ok()) {
      absl::StatusOr<std::string> name = MapName(*haproxy, map_name);
      status = name.ok() ? haproxy->ReplaceMap(*name, map) : name.status();
    }
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("HAProxy ", admin, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace qparams
