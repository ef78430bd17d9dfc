// A server stream that produces each message only once the client has taken the
// last, so that what the server holds is what the producer holds (a page of
// sessions, a piece of an export, a batch of slot records), whatever the stream's
// length. ReadSessions and ExportSessions (QParamsServiceImpl) and ReadSlotRecords
// (ClusterAdminServiceImpl) stream through it.

#ifndef QPARAMS_SERVER_PULL_WRITE_REACTOR_H_
#define QPARAMS_SERVER_PULL_WRITE_REACTOR_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace qparams {

// Fills the next message and returns true, or returns false after the last; an
// error ends the stream with it.
template <typename Message>
using PullProducer = std::function<absl::StatusOr<bool>(Message*)>;

// Thread safety: gRPC runs the reactor's callbacks one at a time; the producer and
// `end` run on them, never concurrently.
template <typename Message>
class PullWriteReactor final : public grpc::ServerWriteReactor<Message> {
 public:
  // What the call's outcome (OK after the last message, or the first error) is
  // finished with: the service logs and audits it there.
  using End = std::function<grpc::Status(const absl::Status& status)>;

  // Writes `produce`'s first message at once; a `produce` that is an error (the
  // caller refused, a bad request) ends the call with it before any message. The
  // reactor deletes itself when the call is done.
  PullWriteReactor(absl::StatusOr<PullProducer<Message>> produce, End end) : end_(std::move(end)) {
    if (!produce.ok()) {
      Stop(produce.status());
      return;
    }
    produce_ = *std::move(produce);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Stop(absl::CancelledError("the stream ended before every message was written"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    message_.Clear();
    absl::StatusOr<bool> produced = produce_(&message_);
    if (!produced.ok() || !*produced) {
      Stop(produced.status());
      return;
    }
    this->StartWrite(&message_);
  }

  void Stop(const absl::Status& status) { this->Finish(end_(status)); }

  const End end_;
  PullProducer<Message> produce_;
  Message message_;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_PULL_WRITE_REACTOR_H_
