#include "client/replica_router.h"

#include <algorithm>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "proto/status.h"

namespace qparams {

namespace {

// The requests, by the replica that owns each one's session (replicas in name order),
// with their indexes in `requests`.
struct Part {
  std::vector<size_t> indexes;
  std::vector<const v1::ObserveRequest*> requests;
};
std::map<std::string, Part> SplitByOwner(const SlotMap& routing,
                                         const std::vector<const v1::ObserveRequest*>& requests) {
  std::map<std::string, Part> parts;
  for (size_t i = 0; i < requests.size(); ++i) {
    Part& part = parts[routing.OwnerOfSession(requests[i]->name())];
    part.indexes.push_back(i);
    part.requests.push_back(requests[i]);
  }
  return parts;
}

// Fails the items of `part` in `attempt` with `status`, the failure of `replica`'s
// call.
void FailPart(const std::string& replica, const absl::Status& status, const Part& part,
              ObserveAttempt& attempt) {
  const absl::Status failed = FromReplica(replica, status);
  for (size_t i : part.indexes) *attempt.responses[i].mutable_status() = wire::ToRpcStatus(failed);
  attempt.failed[replica] = failed;
}

}  // namespace

ReplicaRouter::ReplicaRouter(std::string replica, TopologyCall get_topology)
    : replica_(std::move(replica)), get_topology_(std::move(get_topology)) {}

ReplicaRouter::~ReplicaRouter() = default;

void ReplicaRouter::AddHeaders(grpc::ClientContext& context, const std::string& session,
                               const std::string& replica) {
  if (!session.empty() &&
      std::all_of(session.begin(), session.end(), [](char c) { return c >= 0x20 && c <= 0x7e; })) {
    context.AddMetadata(kSessionHeader, std::string(HashedPart(session)));
  }
  if (!replica.empty()) context.AddMetadata(kReplicaHeader, replica);
}

absl::StatusOr<std::shared_ptr<const SlotMap>> ReplicaRouter::Routing() {
  if (!replica_.empty()) return nullptr;  // every call goes to that replica, whole
  absl::MutexLock lock(&mu_);
  if (!read_) {
    if (absl::Status read = Read(); !read.ok()) return read;
  }
  return routing_;
}

std::vector<std::string> ReplicaRouter::Known() const {
  return routing_ == nullptr ? std::vector<std::string>() : routing_->replicas();
}

std::vector<std::string> ReplicaRouter::KnownReplicas() {
  absl::MutexLock lock(&mu_);
  return Known();
}

absl::Status ReplicaRouter::Read() {
  absl::StatusOr<v1::Topology> topology = get_topology_(Known());
  if (!topology.ok()) {
    // A server from before GetTopology is a single server.
    if (topology.status().code() != absl::StatusCode::kUnimplemented) return topology.status();
    routing_ = nullptr;
    epoch_ = 0;
    read_ = true;
    return absl::OkStatus();
  }
  return Take(*topology);
}

absl::Status ReplicaRouter::Take(const v1::Topology& topology) {
  std::shared_ptr<const SlotMap> routing;
  if (topology.replicas_size() > 1) {
    if (topology.slot_count() != kSlotCount) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the deployment has ", topology.slot_count(), " slots; this client knows ", kSlotCount));
    }
    std::vector<SlotMap::Range> ranges;
    for (const v1::SlotRange& range : topology.ranges()) {
      ranges.push_back({range.low(), range.high(), range.replica()});
    }
    absl::StatusOr<SlotMap> map = SlotMap::FromRanges(ranges, std::max<int64_t>(topology.epoch(), 0));
    if (!map.ok()) {
      return absl::InternalError(
          absl::StrCat("the server's topology is not a slot map: ", map.status().message()));
    }
    routing = std::make_shared<const SlotMap>(*std::move(map));
  }
  routing_ = std::move(routing);
  epoch_ = topology.epoch();
  read_ = true;
  return absl::OkStatus();
}

absl::Status ReplicaRouter::Refresh() {
  if (!replica_.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return Read();  // which keeps the routing read before on an error
}

void ReplicaRouter::Offer(const v1::Topology& topology) {
  if (!replica_.empty()) return;
  absl::MutexLock lock(&mu_);
  if (read_ && topology.epoch() > epoch_) Take(topology).IgnoreError();  // kept as it was
}

absl::StatusOr<std::vector<std::string>> ReplicaRouter::Owners(
    const std::vector<std::string>& names) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  std::vector<std::string> owners;
  if (*routing == nullptr) return owners;
  owners.reserve(names.size());
  for (const std::string& name : names) owners.push_back((*routing)->OwnerOfSession(name));
  return owners;
}

absl::StatusOr<ObserveAttempt> ReplicaRouter::Observe(
    const std::vector<const v1::ObserveRequest*>& requests, const ObserveCall& call) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  ObserveAttempt attempt;
  if (*routing == nullptr) {
    absl::StatusOr<std::vector<v1::ObserveResponse>> responses = call(replica_, requests);
    if (!responses.ok()) return responses.status();
    attempt.responses = *std::move(responses);
    Reroute(requests, attempt, call);
    return attempt;
  }
  std::map<std::string, Part> parts = SplitByOwner(**routing, requests);
  std::vector<absl::StatusOr<std::vector<v1::ObserveResponse>>> answers(
      parts.size(), absl::UnknownError("not answered"));
  std::vector<std::thread> threads;
  size_t k = 0;
  for (const auto& [replica, part] : parts) {
    threads.emplace_back(
        [&, k, replica = &replica, part = &part] { answers[k] = call(*replica, part->requests); });
    ++k;
  }
  for (std::thread& thread : threads) thread.join();
  attempt.responses.resize(requests.size());
  k = 0;
  for (const auto& [replica, part] : parts) {
    absl::StatusOr<std::vector<v1::ObserveResponse>>& answer = answers[k++];
    if (!answer.ok()) {
      FailPart(replica, answer.status(), part, attempt);
      continue;
    }
    for (size_t j = 0; j < part.indexes.size(); ++j) {
      attempt.responses[part.indexes[j]] = std::move((*answer)[j]);
    }
  }
  Reroute(requests, attempt, call);
  return attempt;
}

void ReplicaRouter::Reroute(const std::vector<const v1::ObserveRequest*>& requests,
                            ObserveAttempt& attempt, const ObserveCall& call) {
  if (!Reroutes()) return;
  std::map<std::string, Part> moved;  // by the owner the refusal names
  for (size_t i = 0; i < attempt.responses.size(); ++i) {
    const v1::RpcStatus& status = attempt.responses[i].status();
    if (status.code() != static_cast<int>(absl::StatusCode::kFailedPrecondition) ||
        status.owner().empty()) {
      continue;
    }
    Part& part = moved[status.owner()];
    part.indexes.push_back(i);
    part.requests.push_back(requests[i]);
  }
  if (moved.empty()) return;
  // The next calls route by the new map; these go by the refusals' owners either way.
  Refresh().IgnoreError();
  for (const auto& [owner, part] : moved) {
    absl::StatusOr<std::vector<v1::ObserveResponse>> answer = call(owner, part.requests);
    if (answer.ok() && answer->size() != part.indexes.size()) {
      answer = absl::InternalError(absl::StrCat("answered ", answer->size(), " of ",
                                                part.indexes.size(), " observations"));
    }
    if (!answer.ok()) {
      FailPart(owner, answer.status(), part, attempt);
      continue;
    }
    for (size_t j = 0; j < part.indexes.size(); ++j) {
      attempt.responses[part.indexes[j]] = std::move((*answer)[j]);
    }
  }
}

}  // namespace qparams
