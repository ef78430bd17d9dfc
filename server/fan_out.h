// The calls over every replica of a sharded deployment (docs/sharding.md): a
// replica that a client asks to list, read or export (ListSessions,
// ListScaleGroups, ReadSessions, ExportSessions) asks every replica of its slot map
// for its share, addressed by name (x-qparams-replica) through the deployment's
// router (--cluster_address: HAProxy), with the caller's authorization, and puts
// the shares together as one server's answer. The clients then only route calls
// naming a session; no client merges.
//
// Thread-safe: its methods may run concurrently from any threads. Each blocks for
// the calls it makes, so the service runs them on threads of their own
// (FanOutWriteReactor, FanOut::Detach), never on gRPC's.

#ifndef QPARAMS_SERVER_FAN_OUT_H_
#define QPARAMS_SERVER_FAN_OUT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "domain/engine.h"
#include "grpcpp/grpcpp.h"
#include "qparams/v1/qparams.grpc.pb.h"

namespace qparams {

class FanOut {
 public:
  // `address` is the gRPC target of the deployment's router ("" = no fan-out: a
  // replica answers for its own slots only, as a single server does);
  // `credentials` (null: plaintext) how to reach it. `engine` must outlive it.
  FanOut(const Engine* engine, const std::string& address,
         std::shared_ptr<grpc::ChannelCredentials> credentials);

  // The replicas the call of `context` is answered by, in name order: every replica
  // of the engine's slot map, or none (the call is this replica's alone) without an
  // address, without a map of more than one replica, or for a call addressed to one
  // replica (x-qparams-replica: a client pinned to it, or a replica fanning out).
  std::vector<std::string> Replicas(const grpc::CallbackServerContext& context) const;

  // One page of each of `replicas` merged in name order, with a next_page_token any
  // replica accepts; a replica that cannot be read (UNAVAILABLE, DEADLINE_EXCEEDED,
  // UNKNOWN) is named in unreachable_replicas, any other error (its message naming
  // the replica) is the call's. The calls carry the caller's authorization and
  // deadline (`context`'s), so each replica lists the caller's tenant only.
  absl::StatusOr<v1::ListSessionsResponse> ListSessions(const grpc::CallbackServerContext& context,
                                                        const std::vector<std::string>& replicas,
                                                        const v1::ListSessionsRequest& request);
  // As ListSessions, for scale groups.
  absl::StatusOr<v1::ListScaleGroupsResponse> ListScaleGroups(
      const grpc::CallbackServerContext& context, const std::vector<std::string>& replicas,
      const v1::ListScaleGroupsRequest& request);

  // The sessions of one ReadSessions stream from each replica, merged in name order,
  // through `each` (false: stop, CANCELLED). A replica that cannot be read leaves the
  // others' sessions going on, and the result is then wire::IncompleteError naming
  // it; any other error ends it, naming its replica.
  absl::Status ReadSessions(const grpc::CallbackServerContext& context,
                            const std::vector<std::string>& replicas,
                            const v1::ReadSessionsRequest& request,
                            const std::function<bool(const v1::Session&)>& each);

  // The export of every replica's sessions, byte for byte one server's, through
  // `each` (false: stop, CANCELLED): the first replica renders (RenderExport) the
  // items every replica exports (ExportSessions with `items`). ABORTED, before any
  // byte, unless every replica serves one slot map epoch before and after the
  // shares are read (a move switching); a replica that cannot be read is
  // UNAVAILABLE naming it (an export is whole or refused); another replica's refusal
  // is returned as it is.
  absl::Status ExportSessions(const grpc::CallbackServerContext& context,
                              const std::vector<std::string>& replicas,
                              const v1::ExportSessionsRequest& request,
                              const std::function<bool(const v1::ExportChunk&)>& each);

  // Runs `work` on a thread of its own (a fanned-out unary call, which finishes its
  // reactor last, touching nothing after).
  static void Detach(std::function<void()> work) { std::thread(std::move(work)).detach(); }

 private:
  // A call to `replica` with `context`'s authorization and deadline.
  void Prepare(grpc::ClientContext& out, const grpc::CallbackServerContext& context,
               const std::string& replica) const;
  // The epoch every one of `replicas` serves (GetTopology addressed to each):
  // ABORTED naming them if they differ.
  absl::StatusOr<int64_t> CommonEpoch(const grpc::CallbackServerContext& context,
                                      const std::vector<std::string>& replicas);

  const Engine* const engine_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;  // null without an address
};

// A server stream written from a thread of its own: `body` produces the messages,
// blocking as it needs (on the replicas it reads), and hands each to `write`, which
// returns once the client took it (false once the call ended: `body` then stops).
// Its outcome is finished through `end` (which logs it and adds the trailing
// metadata). Deletes itself when the call is done.
template <typename Message>
class FanOutWriteReactor final : public grpc::ServerWriteReactor<Message> {
 public:
  using Write = std::function<bool(const Message&)>;
  using Body = std::function<absl::Status(const Write& write)>;
  using End = std::function<grpc::Status(const absl::Status& status)>;

  FanOutWriteReactor(Body body, End end) {
    FanOut::Detach([this, body = std::move(body), end = std::move(end)] {
      const absl::Status status = body([this](const Message& message) { return Send(message); });
      this->Finish(end(status));  // the last use of this: OnDone may delete it
    });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    ok_ = ok;
    written_ = true;
  }

  void OnDone() override { delete this; }

 private:
  bool Send(const Message& message) {
    {
      absl::MutexLock lock(&mu_);
      if (!ok_) return false;
      written_ = false;
    }
    message_ = message;
    this->StartWrite(&message_);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&written_));
    return ok_;
  }

  absl::Mutex mu_;
  bool written_ ABSL_GUARDED_BY(mu_) = true;
  bool ok_ ABSL_GUARDED_BY(mu_) = true;
  Message message_;  // being written
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_FAN_OUT_H_
