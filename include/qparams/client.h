// A typed C++ client of qparams.v1.QParamsService, of qparams.v1.ClusterAdmin (the
// admin calls: the slot map and slot moves, on the same channel) and of the standard
// health service: one call per RPC, gRPC statuses turned into absl::Status with the same
// code and message, tensors encoded for the caller; plaintext or TLS (optionally
// mutual), with an optional bearer token.
//
// A Client is thread-safe: its calls may run concurrently from any threads.
//
// Target qparams_client (client/README.md): the RPC client alone; it composes
// qparams_client_routing and includes none of the tools (cli, npy, report).
//
// Sharded deployments (replicas behind HAProxy, docs/sharding.md): every call that
// names one session or one scale group carries the name's hashed part (its hash tag,
// else the whole name; common/slot.h) in the x-qparams-session header, on which the
// balancer routes it to the owner. Calls over many sessions (ObserveStream,
// ObserveBatch, Step, ResumeSteps) are split into one call per owning replica, each
// addressed by the x-qparams-replica header, using the topology the client reads
// with GetTopology at the first such call. Calls over all sessions or groups
// (ListSessions, ReadSessions, ListScaleGroups, ReadScaleGroups, ExportSessions) are
// one call, which the replica reached answers for every replica (server/fan_out.h,
// --cluster_address). A Client of one
// server (no slot map), or of a deployment of one replica, makes the same single
// call as always. After slots move (docs/sharding.md, "Clients follow a move"), a
// call a replica refuses naming another owner (FAILED_PRECONDITION with
// x-qparams-owner) makes the client read the topology again and retry the call once
// at that owner; ObserveStream, ObserveBatch, Step and ResumeSteps send the items
// refused that way again to their owner, answers still in item order; a pinned
// `replica` never retries elsewhere. The routing is a ReplicaRouter (client/replica_router.h) the
// Client composes.

#ifndef QPARAMS_QPARAMS_CLIENT_H_
#define QPARAMS_QPARAMS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/histogram.h"
#include "core/tensor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "qparams/v1/qparams.grpc.pb.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams {

class ReplicaRouter;

struct ClientOptions {
  // The deadline of every call, measured from its start (for ObserveStream, of the
  // whole stream).
  absl::Duration timeout = absl::Seconds(30);
  // The largest message sent or received, in bytes: a tensor travels in one message.
  int max_message_bytes = 64 << 20;
  // The channel's credentials; null means an insecure (plaintext) channel. For TLS,
  // see TlsCredentials.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // With TLS credentials: the name the server's certificate must carry (and the
  // call's authority), instead of the target's host; "" = the target's host. Lets a
  // client reach 127.0.0.1 and check a certificate issued for "localhost".
  std::string tls_server_name;
  // Sent as `authorization: Bearer <bearer_token>` metadata on every QParamsService
  // and ClusterAdmin call (never on Health, which a server answers without one); ""
  // sends none. 1 to 4096 printable ASCII characters without spaces. Over a
  // plaintext channel the token travels in the clear: use TLS credentials beyond
  // loopback.
  std::string bearer_token;
  // Sharded deployments: "" routes each call (see Client); a replica's name (as in
  // the slot map) addresses every call to that replica instead, through the
  // balancer or straight to it, and never splits a call: e.g. to list the sessions
  // of one replica. The replica refuses the call if it is another.
  std::string replica;
  // Safe retries of observations (docs/retries.md). With idempotency_keys, every
  // observation this client sends (Observe*, ObserveStream, ObserveBatch) carries
  // the client's random client_id and the next sequence of its session, unless the
  // request already carries a key (kept as it is); the server applies a key at most
  // once. A keyed observation that fails with UNAVAILABLE, DEADLINE_EXCEEDED or
  // UNKNOWN (a call a proxy reset; docs/retries.md) (the call's status, or a
  // stream/batch item's) is sent again with the same key after
  // an exponential backoff with jitter (retry_initial_backoff, doubling up to
  // retry_max_backoff), as long as the next attempt starts within retry_total of the
  // call's start; each attempt has its own `timeout`. retry_total zero: no retry.
  // Unkeyed observations are never retried (a retry could apply them twice).
  bool idempotency_keys = true;
  absl::Duration retry_total = absl::Seconds(30);
  absl::Duration retry_initial_backoff = absl::Milliseconds(50);
  absl::Duration retry_max_backoff = absl::Seconds(5);
};

// Channel credentials for TLS (pass them as ClientOptions::credentials):
//  - `ca_file`: PEM file of the root certificate(s) the server's certificate must
//    chain to; "" = the default roots (gRPC's: $GRPC_DEFAULT_SSL_ROOTS_FILE_PATH if
//    set, else the system's).
//  - `cert_file`, `key_file`: PEM files of this client's certificate chain and its
//    private key, for a server that requires client certificates (mutual TLS); both
//    or neither.
// The files are read now; the certificates are checked at the first connection, so
// a server the roots do not vouch for (or that refuses the client certificate) shows
// as UNAVAILABLE on the first call. INVALID_ARGUMENT if only one of cert_file and
// key_file is given, or a file holds no PEM block of its kind; FAILED_PRECONDITION
// naming the file if it cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsCredentials(
    const std::string& ca_file, const std::string& cert_file = "",
    const std::string& key_file = "");

// An ObserveRequest carrying a whole tensor.
v1::ObserveRequest TensorObservation(const std::string& name, const TensorView& tensor);

// An ObserveRequest carrying the block minima and maxima of a tensor of `input_shape`,
// reduced by the caller (core ObserveRange): `min` and `max` have the block-count shape
// of the session's granularity and the input's dtype.
v1::ObserveRequest RangeObservation(const std::string& name, const Shape& input_shape,
                                    const TensorView& min, const TensorView& max);

// An ObserveRequest carrying a histogram of |x| binned by the caller (core BinTensor,
// or merged across ranks) for a percentile, entropy or mse session.
v1::ObserveRequest HistogramObservation(const std::string& name, const Histogram& histogram);

// A step contribution (docs/qat.md) of the calling rank to step `step` of the
// step-merged session `name`, for StepRequest.contributions: the whole `tensor`,
// whose range the server takes.
v1::StepContribution TensorContribution(const std::string& name, int64_t step,
                                        const TensorView& tensor);

// The same from the block minima and maxima of the rank's input of `input_shape`,
// reduced by the caller as for RangeObservation: the same merged range, fewer bytes.
v1::StepContribution RangeContribution(const std::string& name, int64_t step,
                                       const Shape& input_shape, const TensorView& min,
                                       const TensorView& max);

// The same carrying nothing: the rank did not run the session's module in that step
// (an unrouted expert, a skipped branch), which still counts towards the step.
v1::StepContribution EmptyContribution(const std::string& name, int64_t step);

class Client {
 public:
  // A client of the server at `target` ("host:port" or any gRPC target URI). The
  // channel connects lazily, so an unreachable server shows as UNAVAILABLE on the
  // first call. INVALID_ARGUMENT for an empty target, a timeout <= 0,
  // max_message_bytes <= 0, a tls_server_name without credentials, a bearer token
  // that metadata cannot carry (the message never shows the token), or a replica
  // name that is not 1 to 64 characters of [a-zA-Z0-9._-], a negative retry_total,
  // a retry_initial_backoff <= 0 or a retry_max_backoff below it.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         ClientOptions options = {});

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // The calculator registry, sorted by key.
  absl::StatusOr<v1::ListCalculatorsResponse> ListCalculators();

  // The qparams of one tensor with `calculator` ("" = dynamic, or static); stores
  // nothing on the server.
  absl::StatusOr<v1::QParams> Compute(const std::string& calculator, const v1::QuantSpec& spec,
                                      const TensorView& tensor);

  // Creates a session: ALREADY_EXISTS if the name is taken.
  absl::StatusOr<v1::Session> CreateSession(const v1::CreateSessionRequest& request);

  // The session `name`: NOT_FOUND if there is none.
  absl::StatusOr<v1::Session> GetSession(const std::string& name);

  // One page of the sessions whose names start with `filter`, ordered by name.
  // `page_size` 0 means the server's default; `page_token` is "" for the first page,
  // else a previous response's next_page_token for the same filter. Sharded: the
  // replicas' pages merged in name order by the deployment, with a next_page_token
  // any replica accepts; the replicas that could not be read (UNAVAILABLE,
  // DEADLINE_EXCEEDED, UNKNOWN) are named in unreachable_replicas.
  absl::StatusOr<v1::ListSessionsResponse> ListSessions(int page_size,
                                                        const std::string& page_token,
                                                        const std::string& filter);

  // Every session whose name starts with `prefix` ("" for all), in name order, one
  // at a time through `each` as the server streams them (ReadSessions). The first
  // error ends it (the server's status, or `each`'s). Sharded: every replica's,
  // merged in name order by the deployment; a replica that cannot be read
  // (UNAVAILABLE, DEADLINE_EXCEEDED, UNKNOWN) leaves the others' sessions going through
  // `each`, then the status is UNAVAILABLE naming it (UnreachableReplicas,
  // proto/status.h).
  absl::Status ReadSessions(const std::string& prefix,
                            const std::function<absl::Status(const v1::Session&)>& each);

  // The sessions under request.prefix rendered in request.format (ExportSessions):
  // the document's bytes, in order, through `each` as the server streams them. The
  // first error ends it (the server's status, or `each`'s); nothing reaches `each`
  // when the server refuses the export. Sharded: one document of every replica's
  // sessions, byte for byte a single server's, put together by the deployment
  // (server/fan_out.h); it is ABORTED, before any byte, while a slot move switches,
  // and made again within ClientOptions::retry_total, then ABORTED.
  absl::Status ExportSessions(const v1::ExportSessionsRequest& request,
                              const std::function<absl::Status(absl::string_view)>& each);

  // Which replica owns which slots (GetTopology). An answer of a newer epoch than
  // the topology this client routes by replaces it.
  absl::StatusOr<v1::Topology> GetTopology();

  // Admin: gives the replica this client reaches (addressed by ClientOptions::replica
  // through a balancer) the slot map `map_text` (a slot map file's text, "# epoch N"
  // included) and returns its topology after it (ClusterAdmin.SetSlotMap,
  // docs/sharding.md). The
  // server's refusals as they are: INVALID_ARGUMENT for a map that does not parse,
  // FAILED_PRECONDITION for an older epoch or a server without sharding,
  // PERMISSION_DENIED without an admin token.
  absl::StatusOr<v1::Topology> SetSlotMap(const std::string& map_text);

  // Deletes the session `name`: NOT_FOUND if there is none.
  absl::Status DeleteSession(const std::string& name);

  // The random client_id this client keys its observations with (see
  // ClientOptions::idempotency_keys): 22 characters of [A-Za-z0-9_-]. Each thread
  // but the first to key one keys under this id followed by ".N" (its own
  // numbering: a thread's calls are in order, concurrent threads' are not).
  const std::string& client_id() const { return client_id_; }

  // One forward of the session `name` on `tensor`. Keyed and retried as
  // ClientOptions::idempotency_keys says, as are the other observe calls; a
  // retried observation the server had applied answers with `duplicate` set.
  absl::StatusOr<v1::ObserveResponse> Observe(const std::string& name, const TensorView& tensor);

  // One ObserveRequest as built by the caller (TensorObservation, ...), keyed and
  // retried as Observe.
  absl::StatusOr<v1::ObserveResponse> Observe(v1::ObserveRequest request);

  // One forward of the session `name` from the block minima and maxima of a tensor of
  // `input_shape` (see RangeObservation). The result is bit-identical to Observe's on
  // the tensor itself.
  absl::StatusOr<v1::ObserveResponse> ObserveRange(const std::string& name,
                                                   const Shape& input_shape, const TensorView& min,
                                                   const TensorView& max);

  // One observation of the histogram session `name` from a histogram the caller
  // binned (see HistogramObservation). The result is bit-identical to Observe's on
  // the tensors it was binned from.
  absl::StatusOr<v1::ObserveResponse> ObserveHistogram(const std::string& name,
                                                       const Histogram& histogram);

  // Sends every request over one ObserveStream and returns the responses, one per
  // request and in order. A request the server refuses fails only its own response
  // (its `status` field); the returned status is the stream's own, and is an error
  // also if the server answered fewer requests than were sent. RESOURCE_EXHAUSTED,
  // with nothing sent, if a request is larger than max_message_bytes. Sharded: one
  // stream per owning replica, concurrently; the first failed stream's status (by
  // replica name) is returned, and the other streams' requests were applied.
  absl::StatusOr<std::vector<v1::ObserveResponse>> ObserveStream(
      const std::vector<v1::ObserveRequest>& requests);

  // Sends every request in one ObserveBatch call and returns the responses, one per
  // request and in order, each with its own `status` as on the stream. The returned
  // status is the call's own: RESOURCE_EXHAUSTED, with nothing applied, beyond
  // wire::kMaxBatchObservations requests or the message size limits. Sharded: one
  // call per owning replica, concurrently; items refused naming another owner go
  // there, and an owner that cannot be reached yet is retried as a failed call is
  // (ClientOptions::retry_total); after the last attempt, its first failed call's
  // status (by replica name) is returned, and the other calls' requests were
  // applied.
  absl::StatusOr<std::vector<v1::ObserveResponse>> ObserveBatch(
      const std::vector<v1::ObserveRequest>& requests);

  // Step-merged sessions (docs/qat.md). The server applies a contribution once per
  // (session, step, rank) and answers a repeat as a `duplicate`, and a read changes
  // nothing, so both calls below are sent again as ClientOptions says for keyed
  // observations (backoff, retry_total): a call that failed UNAVAILABLE or UNKNOWN,
  // or its items refused UNAVAILABLE (a slot being moved). Never DEADLINE_EXCEEDED:
  // that is a read's answer once its wait is over.

  // One training step of rank request.rank (Step): its contributions, which the
  // server applies first and in order, then its reads, each waiting until its step
  // is applied. The answers are one per contribution and one per read, in request
  // order, each with its own status (e.g. FAILED_PRECONDITION for a contribution of
  // another shape than the session's, or a read of a step no longer kept).
  // `timeout` bounds the whole call, retries included, from now (unset:
  // ClientOptions::timeout): how long the reads may wait for the slowest rank. A
  // read still waiting then makes the call DEADLINE_EXCEEDED; its contributions were
  // applied, and the same request sent again is answered `duplicate`, its reads
  // answered once their steps apply. INVALID_ARGUMENT for a timeout <= 0, and from
  // the server for a bad step_timeout or too many items. Sharded: one call per
  // owning replica, concurrently, so that reads waiting at one replica hold back no
  // contribution to another; items refused naming another owner are sent there at
  // once. If a call still fails after its retries, its status is returned (the
  // first by replica name, naming the replica), the other calls' contributions
  // applied.
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request,
                                        std::optional<absl::Duration> timeout = std::nullopt);

  // Restarts step-merged sessions from a job's checkpoint (ResumeSteps): one status
  // per item, in order. Each attempt has ClientOptions::timeout. Retried as Step is,
  // which is safe because a resume applied twice leaves what it left once, as long
  // as no rank contributed to the session in between: a resumed job's ranks
  // contribute only after this returned. Sharded: split, rerouted and failed as
  // Step.
  absl::StatusOr<v1::ResumeStepsResponse> ResumeSteps(const v1::ResumeStepsRequest& request);

  // The cached qparams of the session `name`, as get_qparams.
  absl::StatusOr<v1::GetQParamsResponse> GetQParams(const std::string& name);

  // The histogram of the percentile, entropy or mse session `name` (GetHistogram):
  // INVALID_ARGUMENT for a session of another calculator.
  absl::StatusOr<v1::HistogramObservation> GetHistogram(const std::string& name);

  // Freezes (`enabled`) or unfreezes the qparams of the session `name`.
  absl::StatusOr<v1::Session> SetExportMode(const std::string& name, bool enabled);

  // Changes the granularity of the session `name`: FAILED_PRECONDITION once the
  // session has computed a forward.
  absl::StatusOr<v1::Session> SetGranularity(const std::string& name,
                                             const v1::Granularity& granularity);

  // Scale groups (nvfp4.md §4, docs/scale_groups.md). A group routes by its name as
  // a session does; sharded, a group and its members must share a slot (one hash
  // tag, "{layer0}.qkv"), which the server checks.

  // Creates the group `group` (create_time is ignored): ALREADY_EXISTS if the name
  // is taken, NOT_FOUND for a member that is no session, INVALID_ARGUMENT for no or
  // duplicate members, an unspecified share, members whose resolved specs differ or
  // a share the spec does not allow (nvfp4.md §4.1).
  absl::StatusOr<v1::ScaleGroup> CreateScaleGroup(const v1::ScaleGroup& group);

  // The group `name`: NOT_FOUND if there is none.
  absl::StatusOr<v1::ScaleGroup> GetScaleGroup(const std::string& name);

  // One page of the groups whose names start with `filter`, ordered by name, as
  // ListSessions pages sessions (page_size 0 = the server's default, 50; at most
  // 1000; negative is INVALID_ARGUMENT). Sharded: as ListSessions.
  absl::StatusOr<v1::ListScaleGroupsResponse> ListScaleGroups(int page_size,
                                                              const std::string& page_token,
                                                              const std::string& filter);

  // Every group whose name starts with `filter` ("" for all), in name order, through
  // `each`, following ListScaleGroups's pages of `page_size` (0 = the server's
  // default) to the last. The first error ends it (a page's status, or `each`'s).
  // Sharded, replicas that could not be read: as ReadSessions.
  absl::Status ReadScaleGroups(const std::string& filter, int page_size,
                               const std::function<absl::Status(const v1::ScaleGroup&)>& each);

  // Deletes the group `name`, never its members: NOT_FOUND if there is none.
  absl::Status DeleteScaleGroup(const std::string& name);

  // The shared result of the group `name` (nvfp4.md §4.2): NOT_FOUND for an unknown
  // group; FAILED_PRECONDITION naming a deleted member, members whose specs no
  // longer agree or whose input dtypes differ; `initialized: false` with the
  // uncalibrated members while any is (unless fill_uncalibrated).
  absl::StatusOr<v1::GroupQParams> GetGroupQParams(const std::string& name);

  // Moving slots between replicas (docs/sharding.md, "Moving slots online";
  // client/reshard.h drives them): GetSlotMoves and GetTopologyOf are
  // QParamsService's topology reads, the others ClusterAdmin's admin calls. Each
  // call is addressed to `replica` (x-qparams-replica), through the balancer or
  // straight to it; the server's errors as qparams.proto says.

  // The slots `replica` is migrating or importing (GetSlotMoves).
  absl::StatusOr<v1::SlotMoves> GetSlotMoves(const std::string& replica);
  // Sets `move`'s slots of `replica` to its state (SetSlotState).
  absl::StatusOr<v1::SlotMoves> SetSlotState(const std::string& replica, const v1::SlotMove& move);
  // Deletes `replica`'s sessions and groups of slots [low, high] (DropSlots).
  absl::StatusOr<v1::DropSlotsResponse> DropSlots(const std::string& replica, int low, int high);
  // The topology as `replica` serves it (GetTopology addressed to it).
  absl::StatusOr<v1::Topology> GetTopologyOf(const std::string& replica);
  // SetSlotMap addressed to `replica`.
  absl::StatusOr<v1::Topology> SetSlotMapOf(const std::string& replica,
                                            const std::string& map_text);
  // Streams slots [low, high] of `source` (ReadSlotRecords) into `target`
  // (ImportSessions) as the messages arrive, through `target_client` (this client
  // when null, e.g. through a balancer): what the target imported. The first
  // failure of either stream ends both and is returned, naming which.
  absl::StatusOr<v1::ImportSessionsResponse> CopySlots(const std::string& source,
                                                       const std::string& target, int low,
                                                       int high, Client* target_client = nullptr);

  // The health of `service` ("" = the server as a whole; "qparams.v1.QParamsService").
  // Sends no bearer token.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      const std::string& service = "");

 private:
  Client(const std::shared_ptr<grpc::Channel>& channel, const ClientOptions& options);

  // GetTopology addressed to `replica` ("" = unaddressed), not offered to the router:
  // the router's own read (under its lock).
  absl::StatusOr<v1::Topology> ReadTopology(const std::string& replica);
  // GetTopology through the balancer (any healthy replica answers), or to the pinned
  // replica; if that fails as a retryable call does, addressed to each of
  // `known` in turn (the balancer may not have seen one die yet): the first answer,
  // else the first error. Not offered to the router.
  absl::StatusOr<v1::Topology> ReadAnyTopology(const std::vector<std::string>& known);
  // ObserveStream over one stream, addressed to `replica` ("" = unaddressed).
  absl::StatusOr<std::vector<v1::ObserveResponse>> ObserveStreamTo(
      const std::string& replica, const std::vector<const v1::ObserveRequest*>& requests);
  // ObserveBatch in one call, addressed to `replica` ("" = unaddressed).
  absl::StatusOr<std::vector<v1::ObserveResponse>> ObserveBatchTo(
      const std::string& replica, const std::vector<const v1::ObserveRequest*>& requests);

  // Gives `request` this client's key (its session's next sequence) unless keys are
  // off or it has one.
  void Key(v1::ObserveRequest& request);
  // `requests` keyed as Key says (a copy only when a request needs a key).
  std::vector<v1::ObserveRequest> Keyed(const std::vector<v1::ObserveRequest>& requests);
  // Sends `requests` through `send` (one stream or batch call) and sends again, with
  // their keys, the keyed ones whose call or own status is retryable
  // (ClientOptions::retry_total says which), as ClientOptions says; the responses
  // in order.
  using SendObservations = std::function<absl::StatusOr<std::vector<v1::ObserveResponse>>(
      const std::vector<const v1::ObserveRequest*>&)>;
  absl::StatusOr<std::vector<v1::ObserveResponse>> SendWithRetries(
      const std::vector<const v1::ObserveRequest*>& requests, const SendObservations& send);
  // `requests`, keyed, in attempts of the router (ReplicaRouter::Observe: split by
  // owner, items refused naming another owner sent there) through `call` (one
  // stream or batch call to a replica), retried as SendWithRetries says: an owner
  // that cannot be reached yet is retried as a failed call is. The responses in
  // order, or the failure of the last attempt's first failed call by replica name.
  using ReplicaCall = std::function<absl::StatusOr<std::vector<v1::ObserveResponse>>(
      const std::string& replica, const std::vector<const v1::ObserveRequest*>& requests)>;
  absl::StatusOr<std::vector<v1::ObserveResponse>> SendRouted(
      const std::vector<v1::ObserveRequest>& requests, const ReplicaCall& call);

  // The calls over many sessions answered item by item (Step, ResumeSteps; steps.cc).
  // One call to `replica` ("" = unaddressed) with the items `items` of the caller's
  // request, and `timeout`: the call's status; when OK, the answers are in the
  // caller's response. Items of different calls are different answers, so calls may
  // run concurrently.
  using ItemCall = std::function<absl::Status(const std::string& replica,
                                              const std::vector<size_t>& items,
                                              absl::Duration timeout)>;
  // The status of item `item`'s answer in the caller's response, to read and to set.
  using ItemStatus = std::function<v1::RpcStatus*(size_t item)>;
  // Sends items 0 to names.size() - 1, item i of session names[i], through `call`:
  // split by owning replica, the parts concurrently, items refused naming another
  // owner sent there at once, and the items of a call that failed UNAVAILABLE or
  // UNKNOWN, or refused UNAVAILABLE, sent again as ClientOptions says, each call
  // with `attempt_timeout` but none past `deadline`. A failed call's items take its
  // status. OK once the answers are in, else the first failed call's status by
  // replica name (a topology that could not be read: its error).
  absl::Status SendItems(const std::vector<std::string>& names, const ItemCall& call,
                         const ItemStatus& status, absl::Duration attempt_timeout,
                         absl::Time deadline);

  const absl::Duration timeout_;
  const int max_message_bytes_;
  const std::string authorization_;  // "Bearer <token>", or "" for none
  const std::unique_ptr<v1::QParamsService::Stub> stub_;
  const std::unique_ptr<v1::ClusterAdmin::Stub> admin_stub_;  // on stub_'s channel
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  // Headers, splits and merges of sharded deployments; calls GetTopology.
  const std::unique_ptr<ReplicaRouter> router_;
  const bool idempotency_keys_;
  const absl::Duration retry_total_;
  const absl::Duration retry_initial_backoff_;
  const absl::Duration retry_max_backoff_;
  const std::string client_id_;
  absl::Mutex sequences_mu_;
  // Each keying thread's number (0 for the first), and the last sequence sent per
  // (thread number, session name).
  absl::flat_hash_map<std::thread::id, int> threads_ ABSL_GUARDED_BY(sequences_mu_);
  absl::flat_hash_map<std::pair<int, std::string>, uint64_t> sequences_
      ABSL_GUARDED_BY(sequences_mu_);
};

}  // namespace qparams

#endif  // QPARAMS_QPARAMS_CLIENT_H_
