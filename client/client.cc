#include "client/client.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/page_token.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/convert.h"
#include "proto/status.h"

namespace qparams {
namespace {

// The whole content of the file `path`; FAILED_PRECONDITION naming it (`what` it
// should hold) if it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  absl::StatusOr<std::string> text = qparams::ReadFile(path);
  if (!text.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", text.status().message()));
  }
  return text;
}

// Whether `text` holds a PEM block whose label ("-----BEGIN <label>-----") is
// `label`, or ends with it if `suffix` ("EC PRIVATE KEY" for "PRIVATE KEY").
bool HasPemBlock(absl::string_view text, absl::string_view label, bool suffix) {
  constexpr absl::string_view kBegin = "-----BEGIN ";
  for (size_t at = text.find(kBegin); at != absl::string_view::npos;
       at = text.find(kBegin, at + 1)) {
    const size_t start = at + kBegin.size();
    const size_t end = text.find("-----", start);
    if (end == absl::string_view::npos) return false;
    const absl::string_view found = text.substr(start, end - start);
    if (suffix ? absl::EndsWith(found, label) : found == label) return true;
  }
  return false;
}

// The PEM file `path` ("" for an empty path), which must hold a block of `label`
// (see HasPemBlock); `what` names the file in messages.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what,
                                    absl::string_view label, bool suffix) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> text = ReadFile(path, what);
  if (!text.ok()) return text.status();
  if (!HasPemBlock(*text, label, suffix)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " holds no PEM ", label, " block"));
  }
  return text;
}

// Whether gRPC can send `token` in an ASCII metadata value (and servers split
// "Bearer <token>" at the space).
bool ValidToken(absl::string_view token) {
  if (token.empty() || token.size() > 4096) return false;
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

// Sets the deadline of a call, `timeout` from now, its authorization metadata unless
// `authorization` is "", and the routing header of the session it names unless
// `session` is "" (a balancer in front of sharded replicas routes on it). A name no
// header can carry goes without one: the server refuses that name anyway.
void Prepare(grpc::ClientContext& context, absl::Duration timeout, const std::string& authorization,
             const std::string& session = "") {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!authorization.empty()) context.AddMetadata("authorization", authorization);
  if (!session.empty() &&
      std::all_of(session.begin(), session.end(), [](char c) { return c >= 0x20 && c <= 0x7e; })) {
    context.AddMetadata(kSessionHeader, session);
  }
}

// Addresses the call of `context` to `replica` (x-qparams-replica), unless it is "".
void AddressTo(grpc::ClientContext& context, const std::string& replica) {
  if (!replica.empty()) context.AddMetadata(kReplicaHeader, replica);
}

// Calls the unary `method` of `stub` with a deadline `timeout` from now, the
// `authorization` metadata ("" = none) and the routing header of `session`, and
// addressed to `replica` unless it is "".
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Unary(
    Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, absl::Duration timeout, const std::string& authorization,
    const std::string& session = "", const std::string& replica = "") {
  grpc::ClientContext context;
  Prepare(context, timeout, authorization, session);
  AddressTo(context, replica);
  Response response;
  const grpc::Status status = (stub.*method)(&context, request, &response);
  if (!status.ok()) return wire::FromGrpcStatus(status);
  return response;
}

}  // namespace

v1::ObserveRequest TensorObservation(const std::string& name, const TensorView& tensor) {
  v1::ObserveRequest request;
  request.set_name(name);
  *request.mutable_tensor() = wire::TensorToProto(tensor);
  return request;
}

v1::ObserveRequest RangeObservation(const std::string& name, const Shape& input_shape,
                                    const TensorView& min, const TensorView& max) {
  v1::ObserveRequest request;
  request.set_name(name);
  v1::RangeObservation* range = request.mutable_range();
  range->mutable_input_shape()->Assign(input_shape.begin(), input_shape.end());
  *range->mutable_min() = wire::TensorToProto(min);
  *range->mutable_max() = wire::TensorToProto(max);
  return request;
}

v1::ObserveRequest HistogramObservation(const std::string& name, const Histogram& histogram) {
  v1::ObserveRequest request;
  request.set_name(name);
  *request.mutable_histogram() = wire::HistogramToProto(histogram);
  return request;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate and its key go together: give both files or neither");
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> roots = ReadPem(ca_file, "the CA file", "CERTIFICATE", false);
  if (!roots.ok()) return roots.status();
  absl::StatusOr<std::string> cert =
      ReadPem(cert_file, "the client certificate file", "CERTIFICATE", false);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(key_file, "the client key file", "PRIVATE KEY", true);
  if (!key.ok()) return key.status();
  ssl.pem_root_certs = *std::move(roots);  // "" = gRPC's default roots
  ssl.pem_cert_chain = *std::move(cert);
  ssl.pem_private_key = *std::move(key);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (credentials == nullptr) return absl::InternalError("gRPC made no TLS credentials");
  return credentials;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        ClientOptions options) {
  if (target.empty()) return absl::InvalidArgumentError("the server target is empty");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the timeout must be positive, not ", absl::FormatDuration(options.timeout)));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be positive, not ", options.max_message_bytes));
  }
  if (!options.tls_server_name.empty() && options.credentials == nullptr) {
    return absl::InvalidArgumentError("a TLS server name needs TLS credentials");
  }
  if (!options.replica.empty() && !SlotMap::ValidReplicaName(options.replica)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the replica name \"", options.replica, "\" is not 1 to 64 characters of [a-zA-Z0-9._-]"));
  }
  if (!options.bearer_token.empty() && !ValidToken(options.bearer_token)) {
    return absl::InvalidArgumentError(
        "the bearer token must be 1 to 4096 printable ASCII characters without spaces");
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  return std::unique_ptr<Client>(
      new Client(grpc::CreateCustomChannel(target, credentials, args), options));
}

Client::Client(const std::shared_ptr<grpc::Channel>& channel, const ClientOptions& options)
    : timeout_(options.timeout),
      max_message_bytes_(options.max_message_bytes),
      authorization_(options.bearer_token.empty() ? std::string()
                                                  : absl::StrCat("Bearer ", options.bearer_token)),
      replica_(options.replica),
      stub_(v1::QParamsService::NewStub(channel)),
      health_(grpc::health::v1::Health::NewStub(channel)) {}

absl::StatusOr<v1::ListCalculatorsResponse> Client::ListCalculators() {
  return Unary(*stub_, &v1::QParamsService::Stub::ListCalculators, v1::ListCalculatorsRequest(),
               timeout_, authorization_, /*session=*/"", replica_);
}

absl::StatusOr<v1::QParams> Client::Compute(const std::string& calculator,
                                            const v1::QuantSpec& spec, const TensorView& tensor) {
  v1::ComputeRequest request;
  request.set_calculator(calculator);
  *request.mutable_spec() = spec;
  *request.mutable_tensor() = wire::TensorToProto(tensor);
  absl::StatusOr<v1::ComputeResponse> response =
      Unary(*stub_, &v1::QParamsService::Stub::Compute, request, timeout_, authorization_,
            /*session=*/"", replica_);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_qparams());
}

absl::StatusOr<v1::Session> Client::CreateSession(const v1::CreateSessionRequest& request) {
  return Unary(*stub_, &v1::QParamsService::Stub::CreateSession, request, timeout_, authorization_,
               request.name(), replica_);
}

absl::StatusOr<v1::Session> Client::GetSession(const std::string& name) {
  v1::GetSessionRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::GetSession, request, timeout_, authorization_,
               name, replica_);
}

namespace {

// `status` of a call to one replica of a split call, its message naming the replica.
absl::Status FromReplica(const std::string& replica, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("replica ", replica, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SlotMap>> Client::Routing() {
  if (!replica_.empty()) return nullptr;  // every call goes to that replica, whole
  absl::MutexLock lock(&routing_mu_);
  if (routing_read_) return routing_;
  absl::StatusOr<v1::Topology> topology = GetTopology();
  if (!topology.ok()) {
    // A server from before GetTopology is a single server.
    if (topology.status().code() != absl::StatusCode::kUnimplemented) return topology.status();
  } else if (topology->replicas_size() > 1) {
    if (topology->slot_count() != kSlotCount) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the deployment has ", topology->slot_count(), " slots; this client knows ", kSlotCount));
    }
    std::vector<SlotMap::Range> ranges;
    for (const v1::SlotRange& range : topology->ranges()) {
      ranges.push_back({range.low(), range.high(), range.replica()});
    }
    absl::StatusOr<SlotMap> map = SlotMap::FromRanges(ranges);
    if (!map.ok()) {
      return absl::InternalError(
          absl::StrCat("the server's topology is not a slot map: ", map.status().message()));
    }
    routing_ = std::make_shared<const SlotMap>(*std::move(map));
  }
  routing_read_ = true;
  return routing_;
}

absl::StatusOr<v1::ListSessionsResponse> Client::ListSessions(int page_size,
                                                              const std::string& page_token,
                                                              const std::string& filter) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  v1::ListSessionsRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  request.set_filter(filter);
  if (*routing != nullptr) return ListSessionsMerged(**routing, request);
  return Unary(*stub_, &v1::QParamsService::Stub::ListSessions, request, timeout_, authorization_,
               /*session=*/"", replica_);
}

absl::StatusOr<v1::ListSessionsResponse> Client::ListSessionsMerged(
    const SlotMap& routing, const v1::ListSessionsRequest& request) {
  std::vector<v1::Session> merged;
  // Only the names up to the last one of the shortest-reaching page that has more
  // are surely the next ones: a replica that has more may hold names between its
  // last and another replica's last.
  std::optional<std::string> bound;
  int longest = 0;
  for (const std::string& replica : routing.replicas()) {
    absl::StatusOr<v1::ListSessionsResponse> page =
        Unary(*stub_, &v1::QParamsService::Stub::ListSessions, request, timeout_, authorization_,
              /*session=*/"", replica);
    if (!page.ok()) return FromReplica(replica, page.status());
    longest = std::max(longest, page->sessions_size());
    if (!page->next_page_token().empty() && page->sessions_size() > 0) {
      const std::string& last = page->sessions(page->sessions_size() - 1).name();
      if (!bound || last < *bound) bound = last;
    }
    for (v1::Session& session : *page->mutable_sessions()) merged.push_back(std::move(session));
  }
  std::sort(merged.begin(), merged.end(),
            [](const v1::Session& a, const v1::Session& b) { return a.name() < b.name(); });
  // A page is no longer than the longest replica page (page_size, or the server's
  // default for 0).
  size_t taken = 0;
  while (taken < merged.size() && taken < static_cast<size_t>(longest) &&
         (!bound || merged[taken].name() <= *bound)) {
    ++taken;
  }
  v1::ListSessionsResponse response;
  for (size_t i = 0; i < taken; ++i) *response.add_sessions() = std::move(merged[i]);
  if (taken > 0 && (taken < merged.size() || bound)) {
    response.set_next_page_token(
        EncodePageToken(request.filter(), response.sessions(taken - 1).name()));
  }
  return response;
}

namespace {

// Reads a server stream to its end through `each`; `each`'s error cancels the call.
template <typename Response, typename Request, typename Start>
absl::Status ReadStream(Start start, const Request& request, absl::Duration timeout,
                        const std::string& authorization, const std::string& replica,
                        const std::function<absl::Status(const Response&)>& each) {
  grpc::ClientContext context;
  Prepare(context, timeout, authorization);
  AddressTo(context, replica);
  std::unique_ptr<grpc::ClientReader<Response>> reader = start(&context, request);
  Response response;
  absl::Status stopped;
  while (reader->Read(&response)) {
    stopped = each(response);
    if (!stopped.ok()) {
      context.TryCancel();
      break;
    }
  }
  const grpc::Status finished = reader->Finish();
  if (!stopped.ok()) return stopped;
  return wire::FromGrpcStatus(finished);
}

}  // namespace

absl::Status Client::ReadSessions(const std::string& prefix,
                                  const std::function<absl::Status(const v1::Session&)>& each) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing != nullptr) return ReadSessionsMerged(**routing, prefix, each);
  v1::ReadSessionsRequest request;
  request.set_prefix(prefix);
  return ReadStream<v1::Session>(
      [this](grpc::ClientContext* context, const v1::ReadSessionsRequest& r) {
        return stub_->ReadSessions(context, r);
      },
      request, timeout_, authorization_, replica_, each);
}

absl::Status Client::ReadSessionsMerged(
    const SlotMap& routing, const std::string& prefix,
    const std::function<absl::Status(const v1::Session&)>& each) {
  v1::ReadSessionsRequest request;
  request.set_prefix(prefix);
  // One stream per replica, each read one session ahead; the least name goes next.
  struct Leg {
    std::string replica;
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::Session>> reader;
    v1::Session next;
    bool open = true;
  };
  std::vector<std::unique_ptr<Leg>> legs;
  for (const std::string& replica : routing.replicas()) {
    auto leg = std::make_unique<Leg>();
    leg->replica = replica;
    Prepare(leg->context, timeout_, authorization_);
    AddressTo(leg->context, replica);
    leg->reader = stub_->ReadSessions(&leg->context, request);
    legs.push_back(std::move(leg));
  }
  // Advances `leg`; the status of its stream once it ended with an error.
  auto advance = [](Leg& leg) -> absl::Status {
    if (leg.reader->Read(&leg.next)) return absl::OkStatus();
    leg.open = false;
    const grpc::Status finished = leg.reader->Finish();
    return finished.ok() ? absl::OkStatus()
                         : FromReplica(leg.replica, wire::FromGrpcStatus(finished));
  };
  absl::Status status;
  for (std::unique_ptr<Leg>& leg : legs) {
    if (status.ok()) status = advance(*leg);
  }
  while (status.ok()) {
    Leg* least = nullptr;
    for (std::unique_ptr<Leg>& leg : legs) {
      if (leg->open && (least == nullptr || leg->next.name() < least->next.name())) {
        least = leg.get();
      }
    }
    if (least == nullptr) break;
    status = each(least->next);
    if (status.ok()) status = advance(*least);
  }
  for (std::unique_ptr<Leg>& leg : legs) {
    if (!leg->open) continue;
    leg->context.TryCancel();
    leg->reader->Finish();
  }
  return status;
}

absl::Status Client::ExportSessions(const v1::ExportSessionsRequest& request,
                                    const std::function<absl::Status(absl::string_view)>& each) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "exports of a sharded deployment are not supported: a document holds one replica's "
        "sessions; export from each replica (",
        absl::StrJoin((*routing)->replicas(), ", "), ") by its own address"));
  }
  return ReadStream<v1::ExportChunk>(
      [this](grpc::ClientContext* context, const v1::ExportSessionsRequest& r) {
        return stub_->ExportSessions(context, r);
      },
      request, timeout_, authorization_, replica_,
      [&each](const v1::ExportChunk& chunk) { return each(chunk.data()); });
}

absl::StatusOr<v1::Topology> Client::GetTopology() {
  return Unary(*stub_, &v1::QParamsService::Stub::GetTopology, v1::GetTopologyRequest(), timeout_,
               authorization_, /*session=*/"", replica_);
}

absl::Status Client::DeleteSession(const std::string& name) {
  v1::DeleteSessionRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::DeleteSession, request, timeout_, authorization_,
               name, replica_)
      .status();
}

absl::StatusOr<v1::ObserveResponse> Client::Observe(const std::string& name,
                                                    const TensorView& tensor) {
  return Unary(*stub_, &v1::QParamsService::Stub::Observe, TensorObservation(name, tensor),
               timeout_, authorization_, name, replica_);
}

absl::StatusOr<v1::ObserveResponse> Client::ObserveRange(const std::string& name,
                                                         const Shape& input_shape,
                                                         const TensorView& min,
                                                         const TensorView& max) {
  return Unary(*stub_, &v1::QParamsService::Stub::Observe,
               RangeObservation(name, input_shape, min, max), timeout_, authorization_, name,
               replica_);
}

absl::StatusOr<v1::ObserveResponse> Client::ObserveHistogram(const std::string& name,
                                                             const Histogram& histogram) {
  return Unary(*stub_, &v1::QParamsService::Stub::Observe, HistogramObservation(name, histogram),
               timeout_, authorization_, name, replica_);
}

namespace {

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

// `call`(replica, its requests) for each owner of `requests` at once, and their
// responses put back in the order of `requests`; the first failure by replica name.
template <typename Call>
absl::StatusOr<std::vector<v1::ObserveResponse>> CallEachOwner(
    const SlotMap& routing, const std::vector<v1::ObserveRequest>& requests, Call call) {
  std::map<std::string, Part> parts = SplitByOwner(routing, requests);
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
  return responses;
}

std::vector<const v1::ObserveRequest*> Pointers(const std::vector<v1::ObserveRequest>& requests) {
  std::vector<const v1::ObserveRequest*> pointers;
  pointers.reserve(requests.size());
  for (const v1::ObserveRequest& request : requests) pointers.push_back(&request);
  return pointers;
}

}  // namespace

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::ObserveStream(
    const std::vector<v1::ObserveRequest>& requests) {
  // gRPC would break the stream off at such a request, after the server applied the
  // ones before it.
  for (size_t i = 0; i < requests.size(); ++i) {
    const size_t size = requests[i].ByteSizeLong();
    if (size > static_cast<size_t>(max_message_bytes_)) {
      return absl::ResourceExhaustedError(absl::StrCat("ObserveStream request ", i, " has ", size,
                                                       " bytes; the limit is ", max_message_bytes_,
                                                       " (nothing was sent)"));
    }
  }
  return ObserveByOwner(requests, &Client::ObserveStreamTo);
}

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::ObserveByOwner(
    const std::vector<v1::ObserveRequest>& requests, ObserveCall call) {
  absl::StatusOr<std::shared_ptr<const SlotMap>> routing = Routing();
  if (!routing.ok()) return routing.status();
  if (*routing == nullptr) return (this->*call)(replica_, Pointers(requests));
  return CallEachOwner(
      **routing, requests,
      [this, call](const std::string& replica, const std::vector<const v1::ObserveRequest*>& part) {
        return (this->*call)(replica, part);
      });
}

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::ObserveStreamTo(
    const std::string& replica, const std::vector<const v1::ObserveRequest*>& requests) {
  grpc::ClientContext context;
  Prepare(context, timeout_, authorization_);
  AddressTo(context, replica);
  std::unique_ptr<grpc::ClientReaderWriter<v1::ObserveRequest, v1::ObserveResponse>> stream =
      stub_->ObserveStream(&context);

  // Responses are read while requests are still being written: a server that
  // answers as it goes would otherwise block on flow control once the unread
  // responses fill the window, while this thread blocks writing to it.
  std::vector<v1::ObserveResponse> responses;
  responses.reserve(requests.size());
  std::thread reader([&stream, &responses] {
    v1::ObserveResponse response;
    while (stream->Read(&response)) responses.push_back(std::move(response));
  });
  for (const v1::ObserveRequest* request : requests) {
    if (!stream->Write(*request)) break;  // the stream is over; Finish says why
  }
  stream->WritesDone();
  reader.join();
  const grpc::Status status = stream->Finish();
  if (!status.ok()) return wire::FromGrpcStatus(status);
  if (responses.size() != requests.size()) {
    return absl::InternalError(absl::StrCat("the server answered ", responses.size(), " of the ",
                                            requests.size(), " requests of an ObserveStream"));
  }
  return responses;
}

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::ObserveBatch(
    const std::vector<v1::ObserveRequest>& requests) {
  return ObserveByOwner(requests, &Client::ObserveBatchTo);
}

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::ObserveBatchTo(
    const std::string& replica, const std::vector<const v1::ObserveRequest*>& requests) {
  v1::ObserveBatchRequest batch;
  for (const v1::ObserveRequest* request : requests) *batch.add_observations() = *request;
  absl::StatusOr<v1::ObserveBatchResponse> response =
      Unary(*stub_, &v1::QParamsService::Stub::ObserveBatch, batch, timeout_, authorization_,
            /*session=*/"", replica);
  if (!response.ok()) return response.status();
  if (response->responses_size() != batch.observations_size()) {
    return absl::InternalError(absl::StrCat("ObserveBatch answered ", response->responses_size(),
                                            " of ", batch.observations_size(), " requests"));
  }
  return std::vector<v1::ObserveResponse>(
      std::make_move_iterator(response->mutable_responses()->begin()),
      std::make_move_iterator(response->mutable_responses()->end()));
}

absl::StatusOr<v1::GetQParamsResponse> Client::GetQParams(const std::string& name) {
  v1::GetQParamsRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::GetQParams, request, timeout_, authorization_,
               name, replica_);
}

absl::StatusOr<v1::HistogramObservation> Client::GetHistogram(const std::string& name) {
  v1::GetHistogramRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::GetHistogram, request, timeout_, authorization_,
               name, replica_);
}

absl::StatusOr<v1::Session> Client::SetExportMode(const std::string& name, bool enabled) {
  v1::SetExportModeRequest request;
  request.set_name(name);
  request.set_enabled(enabled);
  return Unary(*stub_, &v1::QParamsService::Stub::SetExportMode, request, timeout_, authorization_,
               name, replica_);
}

absl::StatusOr<v1::Session> Client::SetGranularity(const std::string& name,
                                                   const v1::Granularity& granularity) {
  v1::SetGranularityRequest request;
  request.set_name(name);
  *request.mutable_granularity() = granularity;
  return Unary(*stub_, &v1::QParamsService::Stub::SetGranularity, request, timeout_, authorization_,
               name, replica_);
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Client::Health(
    const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> response =
      Unary(*health_, &grpc::health::v1::Health::Stub::Check, request, timeout_,
            /*authorization=*/std::string(), /*session=*/"", replica_);
  if (!response.ok()) return response.status();
  return response->status();
}

}  // namespace qparams
