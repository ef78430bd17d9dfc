// The commands of a sharded deployment's slots (docs/sharding.md): slot (a name's
// slot, computed here), slotmap push and show, and reshard (moving slots online).

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "common/json_string.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "tools/cli_internal.h"
#include "tools/reshard.h"
#include "tools/slot_map_push.h"

namespace qparams::cli {
namespace {

// The hash tag of `name` that is hashed for its slot, or nullopt for a name that
// hashes whole (common/slot.h).
std::optional<absl::string_view> HashTag(absl::string_view name) {
  const absl::string_view part = HashedPart(name);
  if (part.size() == name.size()) return std::nullopt;
  return part;
}

// "NAME[=VALUE],...": the pieces; INVALID_ARGUMENT naming `flag` for an empty one.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> NamedList(absl::string_view flag,
                                                                           absl::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  if (text.empty()) return out;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(piece, absl::MaxSplits('=', 1));
    if (kv.first.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", text, "\" has an empty entry; separate entries by one comma"));
    }
    out.emplace_back(std::string(kv.first), std::string(kv.second));
  }
  return out;
}

// --haproxy_server's NAME=HOST:PORT[:CHECK_PORT] entries.
absl::StatusOr<std::vector<HaproxyServer>> HaproxyServers(absl::string_view text) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> entries =
      NamedList("--haproxy_server", text);
  if (!entries.ok()) return entries.status();
  std::vector<HaproxyServer> servers;
  for (const auto& [name, address] : *entries) {
    std::vector<std::string> parts = absl::StrSplit(address, ':');
    HaproxyServer server{name, "", 0, 0};
    bool ok = parts.size() == 2 || parts.size() == 3;
    if (ok) {
      server.host = parts[0];
      ok = !server.host.empty() && absl::SimpleAtoi(parts[1], &server.port) && server.port > 0 &&
           server.port <= 65535 &&
           (parts.size() == 2 || (absl::SimpleAtoi(parts[2], &server.check_port) &&
                                  server.check_port > 0 && server.check_port <= 65535));
    }
    if (!ok || !SlotMap::ValidReplicaName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--haproxy_server: \"", name, "=", address,
          "\" is not NAME=HOST:PORT[:CHECK_PORT] (an IPv4 address or a name, ports 1 to 65535)"));
    }
    servers.push_back(std::move(server));
  }
  return servers;
}

// How reshard prints the outcome of a move.
absl::string_view OutcomeName(ReshardResult::Outcome outcome) {
  switch (outcome) {
    case ReshardResult::Outcome::kDone:
      return "done";
    case ReshardResult::Outcome::kAwaitingSwitch:
      return "awaiting_switch";
    case ReshardResult::Outcome::kAborted:
      break;
  }
  return "aborted";
}

}  // namespace

// The slot of each name (common/slot.h), computed here: no call to the server. A
// name with a hash tag shows the tag, the part that is hashed (and sent in the
// routing header).
int Slot(Invocation& in) {
  bool tagged = false;
  for (size_t i = 0; i < in.arg_count(); ++i) tagged = tagged || HashTag(in.arg(i)).has_value();
  if (in.table()) {
    std::vector<std::vector<std::string>> rows = {{"NAME", "SLOT"}};
    if (tagged) rows[0].push_back("HASHED_PART");
    for (size_t i = 0; i < in.arg_count(); ++i) {
      rows.push_back({in.arg(i), absl::StrCat(SlotOf(in.arg(i)))});
      if (tagged) rows.back().push_back(std::string(HashTag(in.arg(i)).value_or("-")));
    }
    PrintColumns(rows, in.out());
    return kExitOk;
  }
  in.out() << "{\n \"slots\": [";
  for (size_t i = 0; i < in.arg_count(); ++i) {
    in.out() << (i == 0 ? "\n  " : ",\n  ") << "{\"name\": " << JsonString(in.arg(i))
             << ", \"slot\": " << SlotOf(in.arg(i));
    if (const std::optional<absl::string_view> tag = HashTag(in.arg(i))) {
      in.out() << ", \"hashed_part\": " << JsonString(*tag);
    }
    in.out() << "}";
  }
  in.out() << "\n ]\n}\n";
  return kExitOk;
}

// Gives the map FILE to the replicas (SetSlotMap), then to HAProxy (runtime API), and
// prints what each took: JSON, or a table of WHERE and STATUS.
int SlotMapPush(Invocation& in) {
  const Options& o = in.options();
  absl::StatusOr<std::string> text = ReadFile(in.arg(0));
  if (!text.ok()) return in.Fail(text.status());
  absl::StatusOr<SlotMap> map = SlotMap::Parse(*text);
  if (!map.ok()) {
    return in.Fail(
        absl::InvalidArgumentError(absl::StrCat(in.arg(0), ": ", map.status().message())));
  }
  PushOptions push;
  push.target = o.target;
  push.client = in.client_options();
  push.haproxy_map = o.haproxy_map;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> replicas =
      NamedList("--replicas", o.replicas);
  if (!replicas.ok()) return Usage(in.err(), replicas.status().message());
  for (const auto& [name, target] : *replicas) {
    if (!SlotMap::ValidReplicaName(name)) {
      return Usage(in.err(), absl::StrCat("--replicas: \"", name,
                                          "\" is not a replica name ([a-zA-Z0-9._-]{1,64})"));
    }
    push.replicas.push_back({name, target});
  }
  if (!o.haproxy_admin.empty()) {
    for (absl::string_view admin : absl::StrSplit(o.haproxy_admin, ',')) {
      if (admin.empty()) return Usage(in.err(), "--haproxy_admin: an empty socket address");
      push.haproxy_admins.emplace_back(admin);
    }
  }
  absl::StatusOr<std::vector<HaproxyServer>> servers = HaproxyServers(o.haproxy_server);
  if (!servers.ok()) return Usage(in.err(), servers.status().message());
  push.haproxy_servers = *std::move(servers);
  if (!push.haproxy_servers.empty() && push.haproxy_admins.empty()) {
    return Usage(in.err(), "--haproxy_server needs --haproxy_admin");
  }
  absl::StatusOr<PushReport> report = PushSlotMap(*map, push);
  if (!report.ok()) {
    if (report.status().code() == absl::StatusCode::kInvalidArgument) {
      return Usage(in.err(), report.status().message());
    }
    return in.Fail(report.status());
  }
  auto describe = [](const absl::Status& status) {
    return status.ok()
               ? std::string("ok")
               : absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
  };
  if (in.table()) {
    std::vector<std::vector<std::string>> rows = {{"WHERE", "EPOCH", "STATUS"}};
    for (const PushReport::Replica& r : report->replicas) {
      rows.push_back({absl::StrCat("replica ", r.replica),
                      r.epoch >= 0 ? absl::StrCat(r.epoch) : "-", describe(r.status)});
    }
    for (const PushReport::Haproxy& h : report->haproxies) {
      rows.push_back({absl::StrCat("haproxy ", h.admin),
                      h.status.ok() ? absl::StrCat(map->epoch()) : "-", describe(h.status)});
    }
    PrintColumns(rows, in.out());
  } else {
    in.out() << "{\n \"epoch\": " << map->epoch() << ",\n \"replicas\": [";
    for (size_t i = 0; i < report->replicas.size(); ++i) {
      const PushReport::Replica& r = report->replicas[i];
      in.out() << (i == 0 ? "\n  " : ",\n  ") << "{\"replica\": " << JsonString(r.replica);
      if (r.epoch >= 0) in.out() << ", \"epoch\": " << r.epoch;
      if (!r.status.ok()) in.out() << ", \"error\": " << JsonString(describe(r.status));
      in.out() << "}";
    }
    in.out() << "\n ],\n \"haproxy\": [";
    for (size_t i = 0; i < report->haproxies.size(); ++i) {
      const PushReport::Haproxy& h = report->haproxies[i];
      in.out() << (i == 0 ? "\n  " : ",\n  ") << "{\"admin\": " << JsonString(h.admin)
               << ", \"map\": " << JsonString(h.map);
      if (!h.status.ok()) in.out() << ", \"error\": " << JsonString(describe(h.status));
      in.out() << "}";
    }
    in.out() << "\n ]\n}\n";
  }
  const absl::Status status = report->status();
  if (!status.ok()) return in.Fail(status);
  return kExitOk;
}

// The slot map the answering replica serves (GetTopology; --replica picks one):
// JSON, the Topology message; table, the map file's text, for `> slots.map`.
int SlotMapShow(Invocation& in) {
  absl::StatusOr<v1::Topology> topology = in.client().GetTopology();
  if (!topology.ok()) return in.Fail(topology.status());
  if (topology->replica_id().empty()) {
    return in.Fail(absl::FailedPreconditionError(
        "the server is not sharded (no --replica_id and --slot_map): it has no slot map"));
  }
  if (!in.table()) {
    PrintJson(*topology, in.out());
    return kExitOk;
  }
  std::vector<SlotMap::Range> ranges;
  for (const v1::SlotRange& range : topology->ranges()) {
    ranges.push_back({range.low(), range.high(), range.replica()});
  }
  absl::StatusOr<SlotMap> map = SlotMap::FromRanges(ranges, topology->epoch());
  if (!map.ok()) {
    return in.Fail(absl::InternalError(
        absl::StrCat("replica ", topology->replica_id(),
                     " answered a topology that is not a slot map: ", map.status().message())));
  }
  in.out() << map->ToText();
  return kExitOk;
}

// Moves slots LOW:HIGH from SOURCE to TARGET online (tools/reshard.h), or resumes
// (--resume) or rolls back (--abort) the move under way. Each step goes to stderr;
// the result to stdout.
int Reshard(Invocation& in) {
  const Options& o = in.options();
  if (o.resume && o.abort) return Usage(in.err(), "--resume and --abort: give one or neither");
  ReshardPlan plan;
  const std::vector<absl::string_view> bounds = absl::StrSplit(in.arg(0), ':');
  if (bounds.size() != 2 || !absl::SimpleAtoi(bounds[0], &plan.low) ||
      !absl::SimpleAtoi(bounds[1], &plan.high)) {
    return Usage(in.err(), absl::StrCat("SLOTS: \"", in.arg(0), "\" is not LOW:HIGH"));
  }
  plan.source = in.arg(1);
  plan.target = in.arg(2);
  // Replicas named in --replica_addresses are reached directly; the others through
  // --target.
  std::map<std::string, std::unique_ptr<Client>> direct;
  if (!o.replica_addresses.empty()) {
    for (absl::string_view entry : absl::StrSplit(o.replica_addresses, ',')) {
      const std::vector<absl::string_view> pair = absl::StrSplit(entry, absl::MaxSplits('=', 1));
      if (pair.size() != 2 || pair[0].empty() || pair[1].empty()) {
        return Usage(in.err(),
                     absl::StrCat("--replica_addresses: \"", entry, "\" is not NAME=HOST:PORT"));
      }
      absl::StatusOr<std::unique_ptr<Client>> client = in.Connect(std::string(pair[1]));
      if (!client.ok()) return Usage(in.err(), client.status().message());
      direct[std::string(pair[0])] = *std::move(client);
    }
  }
  auto client_of = [&](const std::string& replica) -> Client& {
    auto it = direct.find(replica);
    return it == direct.end() ? in.client() : *it->second;
  };
  ReshardOptions options;
  options.log = [&in](absl::string_view line) { in.err() << "reshard: " << line << "\n"; };
  if (!o.stop_before_switch) {
    // The target first, then the source, then every other replica the source's map
    // names (SetSlotMap, each addressed to its replica).
    options.switch_map = [&](const std::string& map_text) -> absl::Status {
      std::vector<std::string> order = {plan.target, plan.source};
      absl::StatusOr<v1::Topology> topology = client_of(plan.source).GetTopologyOf(plan.source);
      if (!topology.ok()) return topology.status();
      for (const std::string& replica : topology->replicas()) {
        if (replica != plan.target && replica != plan.source) order.push_back(replica);
      }
      for (const std::string& replica : order) {
        absl::StatusOr<v1::Topology> set = client_of(replica).SetSlotMapOf(replica, map_text);
        if (!set.ok()) {
          return absl::Status(set.status().code(),
                              absl::StrCat(replica, ": SetSlotMap: ", set.status().message()));
        }
        options.log(absl::StrCat(replica, ": slot map epoch ", set->epoch()));
      }
      // HAProxy last, once every replica took the map: it must not route a slot to
      // a replica that does not own it yet.
      if (o.haproxy_admin.empty()) return absl::OkStatus();
      absl::StatusOr<SlotMap> map = SlotMap::Parse(map_text);
      if (!map.ok()) return map.status();
      const std::vector<std::string> admins = absl::StrSplit(o.haproxy_admin, ',');
      if (absl::Status pushed = PushSlotMapToHaproxy(*map, admins, o.haproxy_map); !pushed.ok()) {
        return pushed;
      }
      options.log(absl::StrCat("HAProxy ", o.haproxy_admin, ": slot map epoch ", map->epoch()));
      return absl::OkStatus();
    };
  }
  const ReshardMode mode = o.resume  ? ReshardMode::kResume
                           : o.abort ? ReshardMode::kAbort
                                     : ReshardMode::kStart;
  absl::StatusOr<ReshardResult> result =
      qparams::Reshard(client_of(plan.source), client_of(plan.target), plan, mode, options);
  if (!result.ok()) return in.Fail(result.status());
  const absl::string_view outcome = OutcomeName(result->outcome);
  if (in.table()) {
    in.out() << "outcome " << outcome << "\nsessions_copied " << result->sessions_copied
             << "\ngroups_copied " << result->groups_copied << "\nsessions_dropped "
             << result->sessions_dropped << "\ncopy_seconds "
             << absl::ToDoubleSeconds(result->copy_time) << "\nfrozen_seconds "
             << absl::ToDoubleSeconds(result->frozen_time) << "\nnext_map\n"
             << result->next_map;
    return kExitOk;
  }
  in.out() << "{\n \"outcome\": \"" << outcome
           << "\",\n \"sessions_copied\": " << result->sessions_copied
           << ",\n \"groups_copied\": " << result->groups_copied
           << ",\n \"sessions_dropped\": " << result->sessions_dropped
           << ",\n \"copy_seconds\": " << absl::ToDoubleSeconds(result->copy_time)
           << ",\n \"frozen_seconds\": " << absl::ToDoubleSeconds(result->frozen_time)
           << ",\n \"next_map\": " << JsonString(result->next_map) << "\n}\n";
  return kExitOk;
}

}  // namespace qparams::cli
