#include "client/replica_router.h"

#include <algorithm>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/page_token.h"
#include "common/slot.h"
#include "common/slot_map.h"

namespace qparams {

absl::Status FromReplica(const std::string& replica, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("replica ", replica, ": ", status.message()));
}

namespace {

std::vector<const v1::ObserveRequest*> Pointers(const std::vector<v1::ObserveRequest>& requests) {
  std::vector<const v1::ObserveRequest*> pointers;
  pointers.reserve(requests.size());
  for (const v1::ObserveRequest& request : requests) pointers.push_back(&request);
  return pointers;
}

// The requests, by the replica that owns each one's session (replicas in name order),
// with their indexes in `requests`.
struct Part {
  std::vector<size_t> indexes;
  std::vector<const v1::ObserveRequest*> requests;
};
std::map<std::string, Part> SplitByOwner(const SlotMap& routing,
                                         const std::vector<v1::ObserveRequest>& requests) {
  std::map<std::string, Part> parts;
  for (size_t i = 0; i < requests.size(); ++i) {
    Part& part = parts[routing.OwnerOfSession(requests[i].name())];
    part.indexes.push_back(i);
    part.requests.push_back(&requests[i]);
  }
  return parts;
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

absl::Status ReplicaRouter::Read() {
  absl::StatusOr<v1::Topology> topology = get_topology_();
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
  read_ = false;
  return Read();
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

absl::StatusOr<std::vector<v1::ObserveResponse>> ReplicaRouter::Observe(
    const std::vector<v1::ObserveRequest>& requests, const ObserveCall& call) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing == nullptr) {
    absl::StatusOr<std::vector<v1::ObserveResponse>> responses =
        call(replica_, Pointers(requests));
    if (responses.ok()) Reroute(requests, *responses, call);
    return responses;
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
  std::vector<v1::ObserveResponse> responses(requests.size());
  k = 0;
  for (const auto& [replica, part] : parts) {
    absl::StatusOr<std::vector<v1::ObserveResponse>>& answer = answers[k++];
    if (!answer.ok()) return FromReplica(replica, answer.status());
    for (size_t j = 0; j < part.indexes.size(); ++j) {
      responses[part.indexes[j]] = std::move((*answer)[j]);
    }
  }
  Reroute(requests, responses, call);
  return responses;
}

void ReplicaRouter::Reroute(const std::vector<v1::ObserveRequest>& requests,
                            std::vector<v1::ObserveResponse>& responses, const ObserveCall& call) {
  if (!Reroutes()) return;
  std::map<std::string, Part> moved;  // by the owner the refusal names
  for (size_t i = 0; i < responses.size(); ++i) {
    const v1::RpcStatus& status = responses[i].status();
    if (status.code() != static_cast<int>(absl::StatusCode::kFailedPrecondition) ||
        status.owner().empty()) {
      continue;
    }
    Part& part = moved[status.owner()];
    part.indexes.push_back(i);
    part.requests.push_back(&requests[i]);
  }
  if (moved.empty()) return;
  // The next calls route by the new map; these go by the refusals' owners either way.
  Refresh().IgnoreError();
  for (const auto& [owner, part] : moved) {
    absl::StatusOr<std::vector<v1::ObserveResponse>> answer = call(owner, part.requests);
    if (!answer.ok() || answer->size() != part.indexes.size()) continue;  // refusals stand
    for (size_t j = 0; j < part.indexes.size(); ++j) {
      responses[part.indexes[j]] = std::move((*answer)[j]);
    }
  }
}

namespace {

// One page of each of `replicas` (`call`'s answers to `request`) merged in name
// order, with a next_page_token any replica accepts. `items` is the response's
// repeated field of named items (sessions, scale groups).
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
  for (const std::string& replica : replicas) {
    absl::StatusOr<Response> page = call(replica, request);
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
  // Advances `leg`; the status of its stream once it ended with an error.
  auto advance = [](Leg& leg) -> absl::Status {
    leg.next = leg.stream->Next();
    if (leg.next) return absl::OkStatus();
    const absl::Status finished = leg.stream->Finish();
    leg.stream = nullptr;
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
  return status;
}

}  // namespace qparams
