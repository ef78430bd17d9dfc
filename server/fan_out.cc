#include "server/fan_out.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/page_token.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "proto/status.h"

namespace qparams {
namespace {

// Whether a replica's share failed as an unreachable replica's does: it is left out
// of a listing, and named, rather than failing it. UNKNOWN is a stream a proxy
// reset as its replica died (a replica never answers it).
bool Unreachable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) || absl::IsUnknown(status);
}

// One page of each of `replicas` (`call`'s answers to `request`) merged in name
// order, with a next_page_token any replica accepts. `items` is the response's
// repeated field of named items (sessions, scale groups).
template <typename Response, typename Request, typename Item>
absl::StatusOr<Response> MergePages(
    const std::vector<std::string>& replicas, const Request& request,
    const std::function<absl::StatusOr<Response>(const std::string&)>& call,
    google::protobuf::RepeatedPtrField<Item>* (Response::*items)()) {
  std::vector<Item> merged;
  // Only the names up to the last one of the shortest-reaching page that has more
  // are surely the next ones: a replica that has more may hold names between its
  // last and another replica's last.
  std::optional<std::string> bound;
  int longest = 0;
  std::vector<std::string> unreachable;
  for (const std::string& replica : replicas) {
    absl::StatusOr<Response> page = call(replica);
    if (!page.ok() && Unreachable(page.status())) {
      unreachable.push_back(replica);
      continue;
    }
    if (!page.ok()) return wire::FromReplica(replica, page.status());
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

// One replica's server stream: its call, read one message ahead.
template <typename Message>
struct Leg {
  std::string replica;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<Message>> reader;
  std::optional<Message> next;

  // Reads the next message; at the end, the stream's status (then reader is null).
  absl::Status Advance() {
    Message message;
    if (reader->Read(&message)) {
      next = std::move(message);
      return absl::OkStatus();
    }
    next.reset();
    const absl::Status finished = wire::FromGrpcStatus(reader->Finish());
    reader = nullptr;
    return finished;
  }

  // Ends the stream early, if it is still open.
  void Cancel() {
    if (reader == nullptr) return;
    context->TryCancel();
    reader->Finish();
    reader = nullptr;
  }
};

}  // namespace

FanOut::FanOut(const Engine* engine, const std::string& address,
               std::shared_ptr<grpc::ChannelCredentials> credentials)
    : engine_(engine) {
  if (address.empty()) return;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // a share holds what its replica sends
  args.SetMaxSendMessageSize(-1);
  stub_ = v1::QParamsService::NewStub(grpc::CreateCustomChannel(
      address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args));
}

std::vector<std::string> FanOut::Replicas(const grpc::CallbackServerContext& context) const {
  if (stub_ == nullptr || context.client_metadata().count(kReplicaHeader) > 0) return {};
  const std::shared_ptr<const SlotMap> map = engine_->slot_map();
  if (map == nullptr) return {};
  std::vector<std::string> replicas = map->replicas();
  if (replicas.size() < 2) return {};
  return replicas;
}

void FanOut::Prepare(grpc::ClientContext& out, const grpc::CallbackServerContext& context,
                     const std::string& replica) const {
  out.set_deadline(context.deadline());
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    out.AddMetadata("authorization", std::string(it->second.data(), it->second.size()));
  }
  out.AddMetadata(kReplicaHeader, replica);
}

absl::StatusOr<v1::ListSessionsResponse> FanOut::ListSessions(
    const grpc::CallbackServerContext& context, const std::vector<std::string>& replicas,
    const v1::ListSessionsRequest& request) {
  return MergePages<v1::ListSessionsResponse>(
      replicas, request,
      [&](const std::string& replica) -> absl::StatusOr<v1::ListSessionsResponse> {
        grpc::ClientContext call;
        Prepare(call, context, replica);
        v1::ListSessionsResponse page;
        const grpc::Status status = stub_->ListSessions(&call, request, &page);
        if (!status.ok()) return wire::FromGrpcStatus(status);
        return page;
      },
      &v1::ListSessionsResponse::mutable_sessions);
}

absl::StatusOr<v1::ListScaleGroupsResponse> FanOut::ListScaleGroups(
    const grpc::CallbackServerContext& context, const std::vector<std::string>& replicas,
    const v1::ListScaleGroupsRequest& request) {
  return MergePages<v1::ListScaleGroupsResponse>(
      replicas, request,
      [&](const std::string& replica) -> absl::StatusOr<v1::ListScaleGroupsResponse> {
        grpc::ClientContext call;
        Prepare(call, context, replica);
        v1::ListScaleGroupsResponse page;
        const grpc::Status status = stub_->ListScaleGroups(&call, request, &page);
        if (!status.ok()) return wire::FromGrpcStatus(status);
        return page;
      },
      &v1::ListScaleGroupsResponse::mutable_groups);
}

absl::Status FanOut::ReadSessions(const grpc::CallbackServerContext& context,
                                  const std::vector<std::string>& replicas,
                                  const v1::ReadSessionsRequest& request,
                                  const std::function<bool(const v1::Session&)>& each) {
  // One stream per replica, each read one session ahead; the least name goes next.
  std::vector<Leg<v1::Session>> legs;
  for (const std::string& replica : replicas) {
    Leg<v1::Session> leg{replica, std::make_unique<grpc::ClientContext>(), nullptr, std::nullopt};
    Prepare(*leg.context, context, replica);
    leg.reader = stub_->ReadSessions(leg.context.get(), request);
    legs.push_back(std::move(leg));
  }
  std::map<std::string, absl::Status> unreachable;
  // Advances `leg`: the error of its stream, but for an unreachable replica's, which
  // is kept in `unreachable` instead.
  auto advance = [&unreachable](Leg<v1::Session>& leg) -> absl::Status {
    const absl::Status status = leg.Advance();
    if (status.ok() || leg.next) return absl::OkStatus();
    if (Unreachable(status)) {
      unreachable[leg.replica] = status;
      return absl::OkStatus();
    }
    return wire::FromReplica(leg.replica, status);
  };
  absl::Status status;
  for (Leg<v1::Session>& leg : legs) {
    if (status.ok()) status = advance(leg);
  }
  while (status.ok()) {
    Leg<v1::Session>* least = nullptr;
    for (Leg<v1::Session>& leg : legs) {
      if (leg.next && (least == nullptr || leg.next->name() < least->next->name())) least = &leg;
    }
    if (least == nullptr) break;
    if (!each(*least->next)) status = absl::CancelledError("the call ended");
    if (status.ok()) status = advance(*least);
  }
  for (Leg<v1::Session>& leg : legs) leg.Cancel();
  if (status.ok() && !unreachable.empty()) return wire::IncompleteError(unreachable);
  return status;
}

absl::StatusOr<int64_t> FanOut::CommonEpoch(const grpc::CallbackServerContext& context,
                                            const std::vector<std::string>& replicas) {
  std::vector<std::string> seen;
  int64_t epoch = -1;
  bool differ = false;
  for (const std::string& replica : replicas) {
    grpc::ClientContext call;
    Prepare(call, context, replica);
    v1::Topology topology;
    const grpc::Status status = stub_->GetTopology(&call, v1::GetTopologyRequest(), &topology);
    if (!status.ok()) return wire::FromReplica(replica, wire::FromGrpcStatus(status));
    seen.push_back(absl::StrCat(replica, " epoch ", topology.epoch()));
    differ |= epoch >= 0 && topology.epoch() != epoch;
    epoch = std::max(epoch, topology.epoch());
  }
  if (differ) {
    return absl::AbortedError(absl::StrCat("the replicas serve different slot maps (",
                                           absl::StrJoin(seen, ", "),
                                           "): a slot move is switching; export again"));
  }
  return epoch;
}

absl::Status FanOut::ExportSessions(const grpc::CallbackServerContext& context,
                                    const std::vector<std::string>& replicas,
                                    const v1::ExportSessionsRequest& request,
                                    const std::function<bool(const v1::ExportChunk&)>& each) {
  absl::StatusOr<int64_t> epoch = CommonEpoch(context, replicas);
  if (!epoch.ok()) return epoch.status();
  grpc::ClientContext render_context;
  Prepare(render_context, context, replicas.front());
  std::unique_ptr<grpc::ClientReaderWriter<v1::RenderExportRequest, v1::ExportChunk>> render =
      stub_->RenderExport(&render_context);
  // Ends the render early (its answer is not wanted) and returns `status`.
  auto abandon = [&](const absl::Status& status) {
    render_context.TryCancel();
    render->Finish();
    return status;
  };
  v1::RenderExportRequest first;
  *first.mutable_options() = request;
  first.mutable_options()->set_items(false);
  // False once the render refused (its status then says why).
  bool open = render->Write(first);
  v1::ExportSessionsRequest share = request;
  share.set_items(true);
  for (const std::string& replica : replicas) {
    if (!open) break;
    grpc::ClientContext call;
    Prepare(call, context, replica);
    std::unique_ptr<grpc::ClientReader<v1::ExportChunk>> reader =
        stub_->ExportSessions(&call, share);
    v1::ExportChunk chunk;
    v1::RenderExportRequest items;
    while (open && reader->Read(&chunk)) {
      *items.mutable_items() = std::move(*chunk.mutable_items());
      open = render->Write(items);
    }
    if (!open) call.TryCancel();
    const absl::Status read = wire::FromGrpcStatus(reader->Finish());
    if (!read.ok() && open) {  // the replica's error: its refusal reads as one server's
      const bool down = absl::IsUnavailable(read) || absl::IsDeadlineExceeded(read);
      return abandon(down ? wire::FromReplica(replica, read) : read);
    }
  }
  if (open) {
    // The shares hold each session once only if no slot changed owner while they
    // were read: the epoch every replica serves is still the one before.
    absl::StatusOr<int64_t> after = CommonEpoch(context, replicas);
    if (after.ok() && *after != *epoch) {
      after = absl::AbortedError(absl::StrCat("the slot map changed during the export (epoch ",
                                              *epoch, " -> ", *after, "); export again"));
    }
    if (!after.ok()) return abandon(after.status());
    render->WritesDone();
  }
  v1::ExportChunk chunk;
  while (render->Read(&chunk)) {
    if (!each(chunk)) return abandon(absl::CancelledError("the call ended"));
  }
  return wire::FromGrpcStatus(render->Finish());
}

}  // namespace qparams
