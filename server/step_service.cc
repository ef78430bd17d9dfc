// QParamsServiceImpl's training steps (docs/qat.md): Step, whose reads wait for their
// step without holding a thread, and ResumeSteps.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/slot.h"
#include "core/status_macros.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "server/qparams_service.h"
#include "server/wire.h"

namespace qparams {
namespace {

// How many items one Step or ResumeSteps call may carry, as the proto says.
constexpr int kMaxStepItems = 10000;

// An item's status on the wire (wire::ToRpcStatus, which keeps the owner of a
// session another replica owns, for the client to send the item there), its message
// prefixed with `what`, which names the item.
v1::RpcStatus ItemStatus(const absl::Status& status, absl::string_view what) {
  v1::RpcStatus out = wire::ToRpcStatus(status);
  if (!status.ok()) out.set_message(absl::StrCat(what, ": ", status.message()));
  return out;
}

}  // namespace

// One Step call. Its contributions apply at once; each read that is not applied yet
// waits through an Engine::StepWait, whose `ready` reads it on the thread that
// applied its step. The call finishes when the last read is answered, or when it is
// cancelled (its deadline, the client gone), whichever first.
//
// Thread safety: a wait's `ready` may run on any thread, also after the call has
// finished and this reactor is deleted: it holds only `call_`, and writes the
// response only while the call is not finished, under call_->mu.
class QParamsServiceImpl::StepReactor final : public grpc::ServerUnaryReactor {
 public:
  StepReactor(QParamsServiceImpl* service, grpc::CallbackServerContext* context,
              const v1::StepRequest* request, v1::StepResponse* response)
      : service_(service),
        context_(context),
        request_(request),
        call_(std::make_shared<Call>(this, response)) {}

  void Start() {
    absl::StatusOr<std::string> tenant = service_->Tenant(context_, "Step");
    if (!tenant.ok()) return FinishOnce(tenant.status());
    tenant_ = *std::move(tenant);
    if (absl::Status valid = CheckLimits(); !valid.ok()) return FinishOnce(valid);
    absl::StatusOr<std::optional<absl::Duration>> timeout = wire::StepTimeoutFromProto(*request_);
    if (!timeout.ok()) return FinishOnce(timeout.status());
    v1::StepResponse* response = call_->response;
    response->mutable_contributions()->Reserve(request_->contributions_size());
    for (const v1::StepContribution& c : request_->contributions()) {
      Contribute(c, *timeout, response->add_contributions());
    }
    for (int i = 0; i < request_->reads_size(); ++i) response->add_reads();
    {
      absl::MutexLock lock(&call_->mu);
      call_->outstanding = request_->reads_size() + 1;  // + 1: until every read is placed
    }
    for (int i = 0; i < request_->reads_size(); ++i) Place(i);
    Answered(std::nullopt);
  }

  void OnCancel() override {
    std::vector<Engine::StepWait> waits;
    {
      absl::MutexLock lock(&call_->mu);
      if (call_->finished) return;
      call_->finished = true;
      waits.swap(call_->waits);
    }
    for (const Engine::StepWait& wait : waits) wait.Cancel();
    const absl::Status status = absl::DeadlineExceededError(
        "the call ended (its deadline, or the client cancelled it) before the steps it "
        "reads were applied; a rank may be late, or gone until its step timeout");
    service_->calls_.LogFailure(context_, "Step", status);
    Finish(wire::ToGrpcStatus(status));
  }

  void OnDone() override { delete this; }

 private:
  struct Call {
    Call(StepReactor* reactor, v1::StepResponse* response) : reactor(reactor), response(response) {}
    absl::Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    int outstanding ABSL_GUARDED_BY(mu) = 0;
    std::vector<Engine::StepWait> waits ABSL_GUARDED_BY(mu);
    StepReactor* const reactor;        // valid until finished
    v1::StepResponse* const response;  // valid until finished
  };

  absl::Status CheckLimits() const {
    if (request_->contributions_size() > kMaxStepItems || request_->reads_size() > kMaxStepItems) {
      return absl::ResourceExhaustedError(
          absl::StrCat("contributions and reads: ", request_->contributions_size(), " and ",
                       request_->reads_size(), " in one Step; at most ", kMaxStepItems,
                       " of each (split the step's sessions over several calls)"));
    }
    return absl::OkStatus();
  }

  void Contribute(const v1::StepContribution& c, std::optional<absl::Duration> timeout,
                  v1::StepContributionResult* result) {
    const std::string what = absl::StrCat("session ", c.name(), ", step ", c.step());
    absl::StatusOr<std::optional<Observation>> x =
        wire::ContributionFromProto(c, service_->options_.max_tensor_elements);
    absl::StatusOr<StepMerge::Outcome> outcome =
        x.ok() ? service_->engine_->Contribute(tenant_, c.name(), c.step(), request_->rank(),
                                               request_->world_size(), *x, timeout)
               : absl::StatusOr<StepMerge::Outcome>(x.status());
    if (!outcome.ok()) {
      service_->calls_.LogFailure(context_, "Step", outcome.status());
      *result->mutable_status() = ItemStatus(outcome.status(), what);
      auto [refusal, fresh] = refused_.try_emplace(c.name(), c.step(), outcome.status());
      if (!fresh && c.step() < refusal->second.first)
        refusal->second = {c.step(), outcome.status()};
      return;
    }
    result->set_duplicate(outcome->duplicate);
    result->set_last_applied_step(outcome->last_applied);
  }

  // Answers read `i` now if it can be, else leaves a wait that answers it later.
  void Place(int i) {
    const v1::StepRead& read = request_->reads(i);
    if (!read.latest() && read.step() < 0) {
      return Answered(ReadResult(i, absl::InvalidArgumentError(absl::StrCat(
                                        "step: ", read.step(), " is negative (or set latest)"))));
    }
    if (read.latest()) return Answered(Read(i));
    // A read that waits for this rank's own refused contribution would wait in vain:
    // it answers with the refusal (UNAVAILABLE for a slot being moved: retry both).
    if (auto refusal = refused_.find(read.name());
        refusal != refused_.end() && read.step() >= refusal->second.first) {
      const absl::Status& why = refusal->second.second;
      absl::Status status(
          why.code(),
          absl::StrCat("not read as of step ", read.step(), ": this call's contribution to step ",
                       refusal->second.first, " was refused: ", why.message()));
      if (auto owner = why.GetPayload(kOwnerPayload); owner.has_value()) {
        status.SetPayload(kOwnerPayload, *owner);
      }
      return Answered(ReadResult(i, status));
    }
    std::shared_ptr<Call> call = call_;
    auto ready = [call, engine = service_->engine_, tenant = tenant_, read, i] {
      std::pair<int, v1::StepReadResult> answer{i, ReadNow(*engine, tenant, read)};
      Answer(*call, std::move(answer));
    };
    absl::StatusOr<std::optional<Engine::StepWait>> wait =
        service_->engine_->WhenStepApplied(tenant_, read.name(), read.step(), ready);
    if (!wait.ok()) return Answered(ReadResult(i, wait.status()));
    if (!wait->has_value()) return Answered(Read(i));
    bool finished;
    {
      absl::MutexLock lock(&call_->mu);
      finished = call_->finished;
      if (!finished) call_->waits.push_back(**wait);
    }
    if (finished) (*wait)->Cancel();
  }

  std::pair<int, v1::StepReadResult> Read(int i) const {
    return {i, ReadNow(*service_->engine_, tenant_, request_->reads(i))};
  }
  std::pair<int, v1::StepReadResult> ReadResult(int i, const absl::Status& status) const {
    v1::StepReadResult result;
    *result.mutable_status() =
        ItemStatus(status, absl::StrCat("session ", request_->reads(i).name()));
    return {i, std::move(result)};
  }

  // The read of an applied step (or the latest), with its checkpoint if asked for.
  static v1::StepReadResult ReadNow(const Engine& engine, const std::string& tenant,
                                    const v1::StepRead& read) {
    v1::StepReadResult result;
    const std::string what = absl::StrCat("session ", read.name());
    absl::StatusOr<Session::StepRead> r = engine.ReadStep(
        tenant, read.name(), read.latest() ? std::nullopt : std::optional<int64_t>(read.step()),
        absl::InfinitePast());
    if (!r.ok()) {
      *result.mutable_status() = ItemStatus(r.status(), what);
      return result;
    }
    result.set_step(r->step);
    if (r->qparams.has_value() && ScaleCount(*r->qparams) > 0) {
      result.set_initialized(true);
      *result.mutable_qparams() = wire::QParamsToProto(*r->qparams);
    }
    if (read.checkpoint()) {
      absl::StatusOr<std::string> checkpoint = engine.CheckpointStep(tenant, read.name(), r->step);
      if (!checkpoint.ok()) {
        *result.mutable_status() = ItemStatus(checkpoint.status(), what);
        return result;
      }
      result.set_checkpoint(*std::move(checkpoint));
    }
    return result;
  }

  void Answered(std::optional<std::pair<int, v1::StepReadResult>> answer) {
    Answer(*call_, std::move(answer));
  }

  // Puts an answer in place (none: the placing is over) and finishes the call with
  // the last one.
  static void Answer(Call& call, std::optional<std::pair<int, v1::StepReadResult>> answer) {
    StepReactor* reactor = nullptr;
    {
      absl::MutexLock lock(&call.mu);
      if (call.finished) return;
      if (answer.has_value())
        *call.response->mutable_reads(answer->first) = std::move(answer->second);
      if (--call.outstanding > 0) return;
      call.finished = true;
      call.waits.clear();
      reactor = call.reactor;
    }
    reactor->Finish(grpc::Status::OK);
  }

  void FinishOnce(const absl::Status& status) {
    {
      absl::MutexLock lock(&call_->mu);
      if (call_->finished) return;
      call_->finished = true;
    }
    Finish(service_->calls_.Finish(context_, "Step", status));
  }

  QParamsServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const v1::StepRequest* const request_;
  std::string tenant_;
  // The sessions whose contribution in this call was refused: the lowest such step
  // and its refusal. Written by Start's contributions, read by its reads.
  std::map<std::string, std::pair<int64_t, absl::Status>> refused_;
  const std::shared_ptr<Call> call_;
};

grpc::ServerUnaryReactor* QParamsServiceImpl::Step(grpc::CallbackServerContext* context,
                                                   const v1::StepRequest* request,
                                                   v1::StepResponse* response) {
  auto* reactor = new StepReactor(this, context, request, response);
  reactor->Start();
  return reactor;
}

grpc::ServerUnaryReactor* QParamsServiceImpl::ResumeSteps(grpc::CallbackServerContext* context,
                                                          const v1::ResumeStepsRequest* request,
                                                          v1::ResumeStepsResponse* response) {
  return Unary(context, "ResumeSteps", [&](const std::string& tenant) {
    if (request->items_size() > kMaxStepItems) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "items: ", request->items_size(), " in one ResumeSteps; at most ", kMaxStepItems));
    }
    for (const v1::ResumeItem& item : request->items()) {
      const absl::Status status =
          engine_->ResumeSteps(tenant, item.name(), item.next_step(), item.checkpoint());
      calls_.LogFailure(context, "ResumeSteps", status);
      *response->add_statuses() = ItemStatus(status, absl::StrCat("session ", item.name()));
      if (status.ok()) {
        LogInfo(absl::StrCat("session ", item.name(), " (tenant \"", tenant,
                             "\"): steps resumed at ", item.next_step(),
                             item.checkpoint().empty() ? ", uninitialized" : ""));
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace qparams
