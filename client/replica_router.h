// The replica routing of a Client (include/qparams/client.h) across sharded replicas behind
// a balancer (docs/sharding.md): which headers a call carries, and how a call over
// many sessions is split into one call per owning replica and put back together.
// (Calls over all sessions, listings, reads and exports, are one call: the
// deployment answers them for every replica, server/fan_out.h.) It owns the topology, read through
// the GetTopology call it is given at the first split call, and again when a replica refuses a call
// naming another owner (Refresh) or a topology of a newer epoch is seen (Offer); it makes no call
// of its own: the Client hands it one per replica. It knows nothing of the Client, so the RPC
// library composes it and not the other way round.
//
// Thread-safe: its methods may run concurrently from any threads.

#ifndef QPARAMS_CLIENT_REPLICA_ROUTER_H_
#define QPARAMS_CLIENT_REPLICA_ROUTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "proto/status.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams {

class SlotMap;

// The statuses of calls over several replicas (proto/status.h), by their names here.
using wire::FromReplica;
using wire::IncompleteError;
using wire::kUnreachablePayload;
using wire::UnreachableReplicas;

// One attempt at a call over many observations (ReplicaRouter::Observe).
struct ObserveAttempt {
  // One per request, in order.
  std::vector<v1::ObserveResponse> responses;
  // The calls of a split attempt that failed, by replica; each of their items'
  // status is the error, its message naming the replica.
  std::map<std::string, absl::Status> failed;
};

class ReplicaRouter {
 public:
  // GetTopology through the balancer; if that fails, addressed to each of
  // `replicas` (the topology read before: none at first) until one answers.
  using TopologyCall =
      std::function<absl::StatusOr<v1::Topology>(const std::vector<std::string>& replicas)>;
  // ObserveStream or ObserveBatch of `requests` in one call to `replica`.
  using ObserveCall = std::function<absl::StatusOr<std::vector<v1::ObserveResponse>>(
      const std::string& replica, const std::vector<const v1::ObserveRequest*>& requests)>;
  // `replica` is ClientOptions::replica: "" routes, a name addresses every call to
  // that replica and never splits one (the topology is then never read).
  // `get_topology` is called at the first split call, under the router's lock.
  ReplicaRouter(std::string replica, TopologyCall get_topology);
  ~ReplicaRouter();

  ReplicaRouter(const ReplicaRouter&) = delete;
  ReplicaRouter& operator=(const ReplicaRouter&) = delete;

  // The replica a call that is not split is addressed to ("" = none).
  const std::string& replica() const { return replica_; }

  // Adds the routing headers of a call naming `session` ("" = none), or a scale
  // group, which routes as a session name does, addressed to `replica` ("" = none):
  // x-qparams-session, carrying the name's hashed part (its hash tag, or the whole
  // name: common/slot.h HashedPart), on which the balancer routes it, and
  // x-qparams-replica. A name no header can carry goes without one: the server
  // refuses that name anyway.
  static void AddHeaders(grpc::ClientContext& context, const std::string& session,
                         const std::string& replica);

  // The owner of each of `names`, in order, by the topology read last; empty when
  // calls are not split (a single server, one replica, a server without
  // GetTopology, or a pinned replica), every name then going to replica(). The
  // first call reads the topology and keeps it: GetTopology's error (other than
  // UNIMPLEMENTED), FAILED_PRECONDITION for a deployment of another slot count,
  // INTERNAL for a topology that is no slot map; after an error the next call reads
  // it again. For the calls over many sessions that the Client splits itself (Step,
  // ResumeSteps).
  absl::StatusOr<std::vector<std::string>> Owners(const std::vector<std::string>& names);

  // Reads the topology again now (a replica refused a call naming another owner):
  // GetTopology's error as Owners says, the topology read before (if any)
  // then kept, so that split calls still route by it. Nothing for a client pinned
  // to a replica.
  absl::Status Refresh();

  // The replicas of the topology read last, in name order; none before the first
  // read, for one server, or for a pinned client.
  std::vector<std::string> KnownReplicas();

  // Takes `topology` (a GetTopology or SetSlotMap answer) if its epoch is newer than
  // the one read; nothing before the first read, or for a pinned client.
  void Offer(const v1::Topology& topology);

  // Whether a call refused naming another owner is retried there: not for a client
  // pinned to a replica.
  bool Reroutes() const { return replica_.empty(); }

  // One attempt at `requests`: `call` with every request addressed to replica(),
  // whose failure is the result, or, split by the topology read last, once per
  // owning replica with its part, concurrently, the responses put back in the
  // order of `requests` (a failed call's items fail with its status, see
  // ObserveAttempt::failed). Then, unless pinned, the items a replica refused
  // naming another owner (RpcStatus.owner) are sent again after a Refresh, in one
  // call per owner addressed to it; their answers replace the refusals, and a
  // retry call that fails makes its status theirs (and is in `failed`): the owner
  // may not be up yet, and a retryable status lets the caller retry them as it
  // retries a failed call (Client::SendWithRetries).
  absl::StatusOr<ObserveAttempt> Observe(const std::vector<const v1::ObserveRequest*>& requests,
                                         const ObserveCall& call);

 private:
  // The slot map, or null when calls are not split.
  absl::StatusOr<std::shared_ptr<const SlotMap>> Routing();
  // Reads the topology (read_ false) and keeps it. Called with mu_ held.
  absl::Status Read() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `topology` as the routing. Called with mu_ held.
  absl::Status Take(const v1::Topology& topology) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `attempt` (answers to `requests`) with the items refused naming another owner
  // sent again there (see Observe).
  void Reroute(const std::vector<const v1::ObserveRequest*>& requests, ObserveAttempt& attempt,
               const ObserveCall& call);
  // The replicas of routing_, in name order. Called with mu_ held.
  std::vector<std::string> Known() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string replica_;
  const TopologyCall get_topology_;

  absl::Mutex mu_;
  bool read_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const SlotMap> routing_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = -1;  // of the topology read
};

}  // namespace qparams

#endif  // QPARAMS_CLIENT_REPLICA_ROUTER_H_
