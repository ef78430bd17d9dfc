#include "qparams/client.h"

#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/call.h"
#include "client/replica_router.h"
#include "common/file.h"
#include "common/slot_map.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/convert.h"
#include "proto/status.h"

namespace qparams {
namespace {

using client_internal::Backoff;
using client_internal::FromCall;
using client_internal::Prepare;
using client_internal::Retryable;
using client_internal::Unary;

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

// A client id no other client is likely to pick: 22 random characters of the
// 64-character alphabet the server takes (132 bits).
std::string RandomClientId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
  absl::BitGen gen;
  std::string id(22, ' ');
  for (char& c : id) c = kAlphabet[absl::Uniform(gen, 0, 64)];
  return id;
}

bool Retryable(const v1::ObserveResponse& response) {
  return Retryable(static_cast<absl::StatusCode>(response.status().code()));
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
  if (options.retry_total < absl::ZeroDuration() ||
      options.retry_initial_backoff <= absl::ZeroDuration() ||
      options.retry_max_backoff < options.retry_initial_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retry_total must be >= 0 (is ", absl::FormatDuration(options.retry_total),
        "), retry_initial_backoff > 0 (is ", absl::FormatDuration(options.retry_initial_backoff),
        ") and retry_max_backoff >= retry_initial_backoff (is ",
        absl::FormatDuration(options.retry_max_backoff), ")"));
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
      stub_(v1::QParamsService::NewStub(channel)),
      admin_stub_(v1::ClusterAdmin::NewStub(channel)),
      health_(grpc::health::v1::Health::NewStub(channel)),
      router_(std::make_unique<ReplicaRouter>(
          options.replica,
          [this](const std::vector<std::string>& known) { return ReadAnyTopology(known); })),
      idempotency_keys_(options.idempotency_keys),
      retry_total_(options.retry_total),
      retry_initial_backoff_(options.retry_initial_backoff),
      retry_max_backoff_(options.retry_max_backoff),
      client_id_(RandomClientId()) {}

Client::~Client() = default;

absl::StatusOr<v1::ListCalculatorsResponse> Client::ListCalculators() {
  return Unary(*stub_, &v1::QParamsService::Stub::ListCalculators, v1::ListCalculatorsRequest(),
               timeout_, authorization_, /*session=*/"", router_->replica());
}

absl::StatusOr<v1::QParams> Client::Compute(const std::string& calculator,
                                            const v1::QuantSpec& spec, const TensorView& tensor) {
  v1::ComputeRequest request;
  request.set_calculator(calculator);
  *request.mutable_spec() = spec;
  *request.mutable_tensor() = wire::TensorToProto(tensor);
  absl::StatusOr<v1::ComputeResponse> response =
      Unary(*stub_, &v1::QParamsService::Stub::Compute, request, timeout_, authorization_,
            /*session=*/"", router_->replica());
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_qparams());
}

absl::StatusOr<v1::Session> Client::CreateSession(const v1::CreateSessionRequest& request) {
  return Unary(*stub_, &v1::QParamsService::Stub::CreateSession, request, timeout_, authorization_,
               request.name(), router_->replica(), router_.get());
}

absl::StatusOr<v1::Session> Client::GetSession(const std::string& name) {
  v1::GetSessionRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::GetSession, request, timeout_, authorization_,
               name, router_->replica(), router_.get());
}

absl::StatusOr<v1::ListSessionsResponse> Client::ListSessions(int page_size,
                                                              const std::string& page_token,
                                                              const std::string& filter) {
  v1::ListSessionsRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  request.set_filter(filter);
  return Unary(*stub_, &v1::QParamsService::Stub::ListSessions, request, timeout_, authorization_,
               /*session=*/"", router_->replica());
}

namespace {

// Reads a server stream to its end through `each`, then finishes the call: `each`'s
// error (which cancels the call), else the call's status.
template <typename Response, typename Request, typename Start>
absl::Status ReadStream(Start start, const Request& request, absl::Duration timeout,
                        const std::string& authorization, const std::string& replica,
                        const std::function<absl::Status(const Response&)>& each) {
  grpc::ClientContext context;
  Prepare(context, timeout, authorization);
  ReplicaRouter::AddHeaders(context, /*session=*/"", replica);
  std::unique_ptr<grpc::ClientReader<Response>> reader = start(&context, request);
  Response response;
  absl::Status stopped;
  while (stopped.ok() && reader->Read(&response)) {
    stopped = each(response);
    if (!stopped.ok()) context.TryCancel();
  }
  const grpc::Status finished = reader->Finish();
  return stopped.ok() ? FromCall(context, finished) : stopped;
}

}  // namespace

absl::Status Client::ReadSessions(const std::string& prefix,
                                  const std::function<absl::Status(const v1::Session&)>& each) {
  v1::ReadSessionsRequest request;
  request.set_prefix(prefix);
  return ReadStream<v1::Session>(
      [this](grpc::ClientContext* context, const v1::ReadSessionsRequest& r) {
        return stub_->ReadSessions(context, r);
      },
      request, timeout_, authorization_, router_->replica(), each);
}

absl::Status Client::ExportSessions(const v1::ExportSessionsRequest& request,
                                    const std::function<absl::Status(absl::string_view)>& each) {
  // An export the deployment refused ABORTED (a slot move was switching) was
  // refused before any byte: again, while retry_total allows.
  Backoff backoff(retry_total_, retry_initial_backoff_, retry_max_backoff_);
  while (true) {
    const absl::Status exported = ReadStream<v1::ExportChunk>(
        [this](grpc::ClientContext* context, const v1::ExportSessionsRequest& r) {
          return stub_->ExportSessions(context, r);
        },
        request, timeout_, authorization_, router_->replica(),
        [&each](const v1::ExportChunk& chunk) { return each(chunk.data()); });
    if (!absl::IsAborted(exported) || !backoff.Wait()) return exported;
  }
}

absl::StatusOr<v1::Topology> Client::GetTopology() {
  absl::StatusOr<v1::Topology> topology = ReadAnyTopology(router_->KnownReplicas());
  if (topology.ok()) router_->Offer(*topology);
  return topology;
}

absl::StatusOr<v1::Topology> Client::ReadAnyTopology(const std::vector<std::string>& known) {
  absl::StatusOr<v1::Topology> topology = ReadTopology(router_->replica());
  if (topology.ok() || !router_->Reroutes() || !Retryable(topology.status())) return topology;
  for (const std::string& replica : known) {
    // Down too, or a replica reached straight refusing the address: the next one.
    absl::StatusOr<v1::Topology> answer = ReadTopology(replica);
    if (answer.ok()) return answer;
  }
  return topology;
}

absl::StatusOr<v1::Topology> Client::ReadTopology(const std::string& replica) {
  return Unary(*stub_, &v1::QParamsService::Stub::GetTopology, v1::GetTopologyRequest(), timeout_,
               authorization_, /*session=*/"", replica);
}

absl::StatusOr<v1::Topology> Client::SetSlotMap(const std::string& map_text) {
  v1::SetSlotMapRequest request;
  request.set_map(map_text);
  absl::StatusOr<v1::Topology> topology =
      Unary(*admin_stub_, &v1::ClusterAdmin::Stub::SetSlotMap, request, timeout_, authorization_,
            /*session=*/"", router_->replica());
  if (topology.ok()) router_->Offer(*topology);
  return topology;
}

absl::Status Client::DeleteSession(const std::string& name) {
  v1::DeleteSessionRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::DeleteSession, request, timeout_, authorization_,
               name, router_->replica(), router_.get())
      .status();
}

void Client::Key(v1::ObserveRequest& request) {
  if (!idempotency_keys_ || !request.client_id().empty()) return;
  uint64_t sequence;
  int thread;
  {
    absl::MutexLock lock(&sequences_mu_);
    thread = threads_.try_emplace(std::this_thread::get_id(), threads_.size()).first->second;
    sequence = ++sequences_[{thread, request.name()}];
  }
  request.set_client_id(thread == 0 ? client_id_ : absl::StrCat(client_id_, ".", thread));
  request.set_sequence(sequence);
}

std::vector<v1::ObserveRequest> Client::Keyed(const std::vector<v1::ObserveRequest>& requests) {
  std::vector<v1::ObserveRequest> keyed = requests;
  for (v1::ObserveRequest& request : keyed) Key(request);
  return keyed;
}

absl::StatusOr<v1::ObserveResponse> Client::Observe(v1::ObserveRequest request) {
  Key(request);
  const std::string name = request.name();
  Backoff backoff(retry_total_, retry_initial_backoff_, retry_max_backoff_);
  while (true) {
    absl::StatusOr<v1::ObserveResponse> response =
        Unary(*stub_, &v1::QParamsService::Stub::Observe, request, timeout_, authorization_, name,
              router_->replica(), router_.get());
    if (response.ok() || request.client_id().empty() || !Retryable(response.status()) ||
        !backoff.Wait()) {
      return response;
    }
  }
}

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::SendWithRetries(
    const std::vector<const v1::ObserveRequest*>& requests, const SendObservations& send) {
  std::vector<v1::ObserveResponse> responses(requests.size());
  std::vector<size_t> pending(requests.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  Backoff backoff(retry_total_, retry_initial_backoff_, retry_max_backoff_);
  while (true) {
    std::vector<const v1::ObserveRequest*> part;
    part.reserve(pending.size());
    bool all_keyed = true;
    for (size_t i : pending) {
      part.push_back(requests[i]);
      all_keyed = all_keyed && !requests[i]->client_id().empty();
    }
    absl::StatusOr<std::vector<v1::ObserveResponse>> answered = send(part);
    if (!answered.ok()) {
      // Which of them the server applied is unknown: only keys make resending safe.
      if (!all_keyed || !Retryable(answered.status()) || !backoff.Wait()) {
        return answered.status();
      }
      continue;
    }
    std::vector<size_t> again;
    for (size_t j = 0; j < pending.size(); ++j) {
      const size_t i = pending[j];
      if (!requests[i]->client_id().empty() && Retryable((*answered)[j])) again.push_back(i);
      responses[i] = std::move((*answered)[j]);
    }
    if (again.empty() || !backoff.Wait()) return responses;
    pending = std::move(again);
  }
}

absl::StatusOr<v1::ObserveResponse> Client::Observe(const std::string& name,
                                                    const TensorView& tensor) {
  return Observe(TensorObservation(name, tensor));
}

absl::StatusOr<v1::ObserveResponse> Client::ObserveRange(const std::string& name,
                                                         const Shape& input_shape,
                                                         const TensorView& min,
                                                         const TensorView& max) {
  return Observe(RangeObservation(name, input_shape, min, max));
}

absl::StatusOr<v1::ObserveResponse> Client::ObserveHistogram(const std::string& name,
                                                             const Histogram& histogram) {
  return Observe(HistogramObservation(name, histogram));
}

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
  return SendRouted(requests, [this](const std::string& replica,
                                     const std::vector<const v1::ObserveRequest*>& part) {
    return ObserveStreamTo(replica, part);
  });
}

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::SendRouted(
    const std::vector<v1::ObserveRequest>& requests, const ReplicaCall& call) {
  std::vector<v1::ObserveRequest> keyed;
  if (idempotency_keys_) keyed = Keyed(requests);
  std::vector<const v1::ObserveRequest*> pointers;
  pointers.reserve(requests.size());
  for (const v1::ObserveRequest& request : idempotency_keys_ ? keyed : requests) {
    pointers.push_back(&request);
  }
  std::map<std::string, absl::Status> failed;  // by the last attempt
  absl::StatusOr<std::vector<v1::ObserveResponse>> responses = SendWithRetries(
      pointers, [&](const std::vector<const v1::ObserveRequest*>& part)
                    -> absl::StatusOr<std::vector<v1::ObserveResponse>> {
        absl::StatusOr<ObserveAttempt> attempt = router_->Observe(part, call);
        if (!attempt.ok()) return attempt.status();
        failed = std::move(attempt->failed);
        return std::move(attempt->responses);
      });
  if (responses.ok() && !failed.empty()) return failed.begin()->second;
  return responses;
}

absl::StatusOr<std::vector<v1::ObserveResponse>> Client::ObserveStreamTo(
    const std::string& replica, const std::vector<const v1::ObserveRequest*>& requests) {
  grpc::ClientContext context;
  Prepare(context, timeout_, authorization_);
  ReplicaRouter::AddHeaders(context, /*session=*/"", replica);
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
  return SendRouted(requests, [this](const std::string& replica,
                                     const std::vector<const v1::ObserveRequest*>& part) {
    return ObserveBatchTo(replica, part);
  });
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
               name, router_->replica(), router_.get());
}

absl::StatusOr<v1::HistogramObservation> Client::GetHistogram(const std::string& name) {
  v1::GetHistogramRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::GetHistogram, request, timeout_, authorization_,
               name, router_->replica(), router_.get());
}

absl::StatusOr<v1::Session> Client::SetExportMode(const std::string& name, bool enabled) {
  v1::SetExportModeRequest request;
  request.set_name(name);
  request.set_enabled(enabled);
  return Unary(*stub_, &v1::QParamsService::Stub::SetExportMode, request, timeout_, authorization_,
               name, router_->replica(), router_.get());
}

absl::StatusOr<v1::Session> Client::SetGranularity(const std::string& name,
                                                   const v1::Granularity& granularity) {
  v1::SetGranularityRequest request;
  request.set_name(name);
  *request.mutable_granularity() = granularity;
  return Unary(*stub_, &v1::QParamsService::Stub::SetGranularity, request, timeout_, authorization_,
               name, router_->replica(), router_.get());
}

absl::StatusOr<v1::ScaleGroup> Client::CreateScaleGroup(const v1::ScaleGroup& group) {
  v1::CreateScaleGroupRequest request;
  *request.mutable_group() = group;
  return Unary(*stub_, &v1::QParamsService::Stub::CreateScaleGroup, request, timeout_,
               authorization_, group.name(), router_->replica(), router_.get());
}

absl::StatusOr<v1::ScaleGroup> Client::GetScaleGroup(const std::string& name) {
  v1::GetScaleGroupRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::GetScaleGroup, request, timeout_,
               authorization_, name, router_->replica(), router_.get());
}

absl::StatusOr<v1::ListScaleGroupsResponse> Client::ListScaleGroups(int page_size,
                                                                    const std::string& page_token,
                                                                    const std::string& filter) {
  v1::ListScaleGroupsRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  request.set_filter(filter);
  return Unary(*stub_, &v1::QParamsService::Stub::ListScaleGroups, request, timeout_,
               authorization_, /*session=*/"", router_->replica());
}

absl::Status Client::ReadScaleGroups(
    const std::string& filter, int page_size,
    const std::function<absl::Status(const v1::ScaleGroup&)>& each) {
  std::string token;
  std::set<std::string> unreachable;  // on any page
  do {
    absl::StatusOr<v1::ListScaleGroupsResponse> page = ListScaleGroups(page_size, token, filter);
    if (!page.ok()) return page.status();
    for (const v1::ScaleGroup& group : page->groups()) {
      if (absl::Status status = each(group); !status.ok()) return status;
    }
    unreachable.insert(page->unreachable_replicas().begin(), page->unreachable_replicas().end());
    token = std::move(*page->mutable_next_page_token());
  } while (!token.empty());
  if (unreachable.empty()) return absl::OkStatus();
  return IncompleteError(std::vector<std::string>(unreachable.begin(), unreachable.end()));
}

absl::Status Client::DeleteScaleGroup(const std::string& name) {
  v1::DeleteScaleGroupRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::DeleteScaleGroup, request, timeout_,
               authorization_, name, router_->replica(), router_.get())
      .status();
}

absl::StatusOr<v1::GroupQParams> Client::GetGroupQParams(const std::string& name) {
  v1::GetGroupQParamsRequest request;
  request.set_name(name);
  return Unary(*stub_, &v1::QParamsService::Stub::GetGroupQParams, request, timeout_,
               authorization_, name, router_->replica(), router_.get());
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Client::Health(
    const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> response =
      Unary(*health_, &grpc::health::v1::Health::Stub::Check, request, timeout_,
            /*authorization=*/std::string(), /*session=*/"", router_->replica());
  if (!response.ok()) return response.status();
  return response->status();
}

// ---- Moving slots ----

absl::StatusOr<v1::SlotMoves> Client::GetSlotMoves(const std::string& replica) {
  return Unary(*stub_, &v1::QParamsService::Stub::GetSlotMoves, v1::GetSlotMovesRequest(),
               timeout_, authorization_, /*session=*/"", replica);
}

absl::StatusOr<v1::SlotMoves> Client::SetSlotState(const std::string& replica,
                                                   const v1::SlotMove& move) {
  v1::SetSlotStateRequest request;
  *request.mutable_move() = move;
  return Unary(*admin_stub_, &v1::ClusterAdmin::Stub::SetSlotState, request, timeout_,
               authorization_, /*session=*/"", replica);
}

absl::StatusOr<v1::DropSlotsResponse> Client::DropSlots(const std::string& replica, int low,
                                                        int high) {
  v1::DropSlotsRequest request;
  request.set_low(low);
  request.set_high(high);
  return Unary(*admin_stub_, &v1::ClusterAdmin::Stub::DropSlots, request, timeout_,
               authorization_, /*session=*/"", replica);
}

absl::StatusOr<v1::Topology> Client::GetTopologyOf(const std::string& replica) {
  return Unary(*stub_, &v1::QParamsService::Stub::GetTopology, v1::GetTopologyRequest(), timeout_,
               authorization_, /*session=*/"", replica);
}

absl::StatusOr<v1::Topology> Client::SetSlotMapOf(const std::string& replica,
                                                  const std::string& map_text) {
  v1::SetSlotMapRequest request;
  request.set_map(map_text);
  return Unary(*admin_stub_, &v1::ClusterAdmin::Stub::SetSlotMap, request, timeout_,
               authorization_, /*session=*/"", replica);
}

absl::StatusOr<v1::ImportSessionsResponse> Client::CopySlots(const std::string& source,
                                                             const std::string& target, int low,
                                                             int high, Client* target_client) {
  Client& to = target_client != nullptr ? *target_client : *this;
  grpc::ClientContext import_context;
  Prepare(import_context, to.timeout_, to.authorization_);
  ReplicaRouter::AddHeaders(import_context, /*session=*/"", target);
  v1::ImportSessionsResponse imported;
  std::unique_ptr<grpc::ClientWriter<v1::SlotRecords>> writer =
      to.admin_stub_->ImportSessions(&import_context, &imported);
  v1::ReadSlotRecordsRequest request;
  request.set_low(low);
  request.set_high(high);
  bool written = true;
  const absl::Status read = ReadStream<v1::SlotRecords>(
      [this](grpc::ClientContext* context, const v1::ReadSlotRecordsRequest& r) {
        return admin_stub_->ReadSlotRecords(context, r);
      },
      request, timeout_, authorization_, source, [&](const v1::SlotRecords& batch) {
        if (writer->Write(batch)) return absl::OkStatus();
        written = false;  // the import ended: its status says why
        return absl::CancelledError("the import stream ended");
      });
  if (written && !read.ok()) {
    import_context.TryCancel();
    writer->Finish();  // cancelled: the read's error is the one to report
    return absl::Status(read.code(), absl::StrCat("reading slots ", low, ":", high, " of ",
                                                  source, ": ", read.message()));
  }
  if (written) writer->WritesDone();
  if (const grpc::Status finished = writer->Finish(); !finished.ok()) {
    const absl::Status status = wire::FromGrpcStatus(finished);
    return absl::Status(status.code(),
                        absl::StrCat("importing into ", target, ": ", status.message()));
  }
  return imported;
}

}  // namespace qparams
