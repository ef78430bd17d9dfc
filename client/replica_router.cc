#include "client/replica_router.h"

#include <algorithm>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/page_token.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "proto/status.h"

namespace qparams {

absl::Status FromReplica(const std::string& replica, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("replica ", replica, ": ", status.message()));
}

std::vector<std::string> UnreachableReplicas(const absl::Status& status) {
  std::vector<std::string> replicas;
  if (const absl::optional<absl::Cord> payload = status.GetPayload(kUnreachablePayload)) {
    replicas = absl::StrSplit(std::string(*payload), ',', absl::SkipEmpty());
  }
  return replicas;
}

absl::Status IncompleteError(const std::map<std::string, absl::Status>& failed) {
  std::vector<std::string> names, messages;
  for (const auto& [replica, status] : failed) {
    names.push_back(replica);
    messages.emplace_back(FromReplica(replica, status).message());
  }
  absl::Status status = absl::UnavailableError(absl::StrCat(
      "the listing is incomplete: ", failed.size(),
      " replica(s) could not be read, so their sessions and groups are not in it: ",
      absl::StrJoin(messages, "; ")));
  status.SetPayload(kUnreachablePayload, absl::Cord(absl::StrJoin(names, ",")));
  return status;
}

absl::Status IncompleteError(const std::vector<std::string>& unreachable) {
  std::map<std::string, absl::Status> failed;
  for (const std::string& replica : unreachable) {
    failed[replica] = absl::UnavailableError("could not be read");
  }
  return IncompleteError(failed);
}

namespace {

// Whether a replica's listing failed as an unreachable replica's does: it is left
// out of the merge, and named, rather than failing it. UNKNOWN is a stream a proxy
// reset as its replica died (the server never answers it).
bool Unreachable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsUnknown(status);
}


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

absl::StatusOr<std::vector<std::string>> ReplicaRouter::SplitReplicas() {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing == nullptr) return std::vector<std::string>();
  return (*routing)->replicas();
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

namespace {

// One page of each of `replicas` (`call`'s answers to `request`) merged in name
// order, with a next_page_token any replica accepts. `items` is the response's
// repeated field of named items (sessions, scale groups). A replica that cannot be
// read (Unreachable) is named in unreachable_replicas; any other error fails it.
template <typename Response, typename Request, typename Item>
absl::StatusOr<Response> MergePages(
    const std::vector<std::string>& replicas, const Request& request,
    const std::function<absl::StatusOr<Response>(const std::string&, const Request&)>& call,
    google::protobuf::RepeatedPtrField<Item>* (Response::*items)()) {
  std::vector<Item> merged;
  // Only the names up to the last one of the shortest-reaching page that has more
  // are surely the next ones: a replica that has more may hold names between its
  // last and another replica's last.
  std::optional<std::string> bound;
  int longest = 0;
  std::vector<std::string> unreachable;
  for (const std::string& replica : replicas) {
    absl::StatusOr<Response> page = call(replica, request);
    if (!page.ok() && Unreachable(page.status())) {
      unreachable.push_back(replica);
      continue;
    }
    if (!page.ok()) return FromReplica(replica, page.status());
    google::protobuf::RepeatedPtrField<Item>& got = *((*page).*items)();
    longest = std::max(longest, got.size());
    if (!page->next_page_token().empty() && !got.empty()) {
      const std::string& last = got[got.size() - 1].name();
      if (!bound || last < *bound) bound = last;
    }
    for (Item& item : got) merged.push_back(std::move(item));
  }
  std::sort(merged.begin(), merged.end(),
            [](const Item& a, const Item& b) { return a.name() < b.name(); });
  // A page is no longer than the longest replica page (page_size, or the server's
  // default for 0).
  size_t taken = 0;
  while (taken < merged.size() && taken < static_cast<size_t>(longest) &&
         (!bound || merged[taken].name() <= *bound)) {
    ++taken;
  }
  Response response;
  google::protobuf::RepeatedPtrField<Item>& page = *(response.*items)();
  for (size_t i = 0; i < taken; ++i) *page.Add() = std::move(merged[i]);
  if (taken > 0 && (taken < merged.size() || bound)) {
    response.set_next_page_token(EncodePageToken(request.filter(), page[taken - 1].name()));
  }
  for (std::string& replica : unreachable) response.add_unreachable_replicas(std::move(replica));
  return response;
}

}  // namespace

absl::StatusOr<v1::ListSessionsResponse> ReplicaRouter::ListSessions(
    const v1::ListSessionsRequest& request, const ListCall& call) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing == nullptr) return call(replica_, request);
  return MergePages((*routing)->replicas(), request, call,
                    &v1::ListSessionsResponse::mutable_sessions);
}

absl::StatusOr<v1::ListScaleGroupsResponse> ReplicaRouter::ListScaleGroups(
    const v1::ListScaleGroupsRequest& request, const ListGroupsCall& call) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing == nullptr) return call(replica_, request);
  return MergePages((*routing)->replicas(), request, call,
                    &v1::ListScaleGroupsResponse::mutable_groups);
}

absl::Status ReplicaRouter::ReadSessions(
    const OpenSessions& open, const std::function<absl::Status(const v1::Session&)>& each) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing == nullptr) {
    std::unique_ptr<SessionStream> stream = open(replica_);
    absl::Status stopped;
    for (std::optional<v1::Session> session = stream->Next(); session; session = stream->Next()) {
      stopped = each(*session);
      if (!stopped.ok()) {
        stream->Cancel();
        break;
      }
    }
    const absl::Status finished = stream->Finish();
    return stopped.ok() ? finished : stopped;
  }
  // One stream per replica, each read one session ahead; the least name goes next.
  struct Leg {
    std::string replica;
    std::unique_ptr<SessionStream> stream;
    std::optional<v1::Session> next;
  };
  std::vector<Leg> legs;
  for (const std::string& replica : (*routing)->replicas()) {
    legs.push_back({replica, open(replica), std::nullopt});
  }
  // Advances `leg`; the status of its stream once it ended with an error, but for
  // a replica that cannot be read, which is kept in `unreachable` instead.
  std::map<std::string, absl::Status> unreachable;
  auto advance = [&unreachable](Leg& leg) -> absl::Status {
    leg.next = leg.stream->Next();
    if (leg.next) return absl::OkStatus();
    const absl::Status finished = leg.stream->Finish();
    leg.stream = nullptr;
    if (Unreachable(finished)) {
      unreachable[leg.replica] = finished;
      return absl::OkStatus();
    }
    return finished.ok() ? absl::OkStatus() : FromReplica(leg.replica, finished);
  };
  absl::Status status;
  for (Leg& leg : legs) {
    if (status.ok()) status = advance(leg);
  }
  while (status.ok()) {
    Leg* least = nullptr;
    for (Leg& leg : legs) {
      if (leg.next && (least == nullptr || leg.next->name() < least->next->name())) least = &leg;
    }
    if (least == nullptr) break;
    status = each(*least->next);
    if (status.ok()) status = advance(*least);
  }
  for (Leg& leg : legs) {
    if (leg.stream == nullptr) continue;
    leg.stream->Cancel();
    leg.stream->Finish().IgnoreError();  // the merge already failed
  }
  if (status.ok() && !unreachable.empty()) return IncompleteError(unreachable);
  return status;
}

}  // namespace qparams
