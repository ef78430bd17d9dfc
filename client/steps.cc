// The Client's calls for step-merged sessions (docs/qat.md): Step and ResumeSteps,
// and the routing they share (SendItems). See include/qparams/client.h for the contracts.

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/call.h"
#include "client/replica_router.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "qparams/client.h"

namespace qparams {
namespace {

using client_internal::Backoff;
using client_internal::Unary;

// Items of a call, by the replica they go to.
using Parts = std::map<std::string, std::vector<size_t>>;

// Runs `send` on every part at once, each on a thread of its own but the last, which
// runs on the caller's: a part's reads may wait for their step, which must not hold
// back another replica's part.
void SendConcurrently(
    const Parts& parts,
    const std::function<void(const std::string&, const std::vector<size_t>&)>& send) {
  std::vector<std::thread> threads;
  auto part = parts.begin();
  for (; part != parts.end() && std::next(part) != parts.end(); ++part) {
    threads.emplace_back([&send, part] { send(part->first, part->second); });
  }
  if (part != parts.end()) send(part->first, part->second);
  for (std::thread& thread : threads) thread.join();
}

// An item answered UNAVAILABLE (a slot being moved, or its call's replica down) or
// UNKNOWN (its call reset by a proxy) is sent again. DEADLINE_EXCEEDED is not: the
// deadline covers every attempt, and it passed.
bool SendAgain(const v1::RpcStatus& status) {
  return status.code() == static_cast<int>(absl::StatusCode::kUnavailable) ||
         status.code() == static_cast<int>(absl::StatusCode::kUnknown);
}

bool SendAgain(const absl::Status& status) { return SendAgain(wire::ToRpcStatus(status)); }

}  // namespace

v1::StepContribution TensorContribution(const std::string& name, int64_t step,
                                        const TensorView& tensor) {
  v1::StepContribution contribution;
  contribution.set_name(name);
  contribution.set_step(step);
  *contribution.mutable_tensor() = wire::TensorToProto(tensor);
  return contribution;
}

v1::StepContribution RangeContribution(const std::string& name, int64_t step,
                                       const Shape& input_shape, const TensorView& min,
                                       const TensorView& max) {
  v1::StepContribution contribution;
  contribution.set_name(name);
  contribution.set_step(step);
  *contribution.mutable_range() =
      std::move(*RangeObservation(name, input_shape, min, max).mutable_range());
  return contribution;
}

v1::StepContribution EmptyContribution(const std::string& name, int64_t step) {
  v1::StepContribution contribution;
  contribution.set_name(name);
  contribution.set_step(step);
  return contribution;
}

absl::StatusOr<v1::StepResponse> Client::Step(const v1::StepRequest& request,
                                              std::optional<absl::Duration> timeout) {
  const absl::Duration wait = timeout.value_or(timeout_);
  if (wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the timeout of a Step must be positive, not ", absl::FormatDuration(wait)));
  }
  const absl::Time deadline = absl::Now() + wait;
  const size_t contributions = request.contributions_size();
  std::vector<std::string> names;
  names.reserve(contributions + request.reads_size());
  v1::StepResponse response;
  for (const v1::StepContribution& contribution : request.contributions()) {
    names.push_back(contribution.name());
    response.add_contributions();
  }
  for (const v1::StepRead& read : request.reads()) {
    names.push_back(read.name());
    response.add_reads();
  }
  // Items [0, contributions) are the contributions, the rest the reads.
  const ItemCall call = [&](const std::string& replica, const std::vector<size_t>& items,
                            absl::Duration call_timeout) -> absl::Status {
    v1::StepRequest part;
    // Items come in request order: all of them are the request itself, uncopied.
    const bool whole = items.size() == names.size();
    if (!whole) {
      part.set_rank(request.rank());
      part.set_world_size(request.world_size());
      if (request.has_step_timeout()) *part.mutable_step_timeout() = request.step_timeout();
      for (size_t i : items) {
        if (i < contributions) {
          *part.add_contributions() = request.contributions(i);
        } else {
          *part.add_reads() = request.reads(i - contributions);
        }
      }
    }
    const v1::StepRequest& sent = whole ? request : part;
    absl::StatusOr<v1::StepResponse> answer =
        Unary(*stub_, &v1::QParamsService::Stub::Step, sent, call_timeout, authorization_,
              /*session=*/"", replica);
    if (!answer.ok()) return answer.status();
    if (answer->contributions_size() != sent.contributions_size() ||
        answer->reads_size() != sent.reads_size()) {
      return absl::InternalError(absl::StrCat(
          "Step answered ", answer->contributions_size(), " of ", sent.contributions_size(),
          " contributions and ", answer->reads_size(), " of ", sent.reads_size(), " reads"));
    }
    int c = 0, r = 0;
    for (size_t i : items) {
      if (i < contributions) {
        *response.mutable_contributions(i) = std::move(*answer->mutable_contributions(c++));
      } else {
        *response.mutable_reads(i - contributions) = std::move(*answer->mutable_reads(r++));
      }
    }
    return absl::OkStatus();
  };
  const absl::Status sent = SendItems(
      names, call,
      [&](size_t i) {
        return i < contributions ? response.mutable_contributions(i)->mutable_status()
                                 : response.mutable_reads(i - contributions)->mutable_status();
      },
      wait, deadline);
  if (!sent.ok()) return sent;
  return response;
}

absl::StatusOr<v1::ResumeStepsResponse> Client::ResumeSteps(const v1::ResumeStepsRequest& request) {
  std::vector<std::string> names;
  names.reserve(request.items_size());
  v1::ResumeStepsResponse response;
  for (const v1::ResumeItem& item : request.items()) {
    names.push_back(item.name());
    response.add_statuses();
  }
  const ItemCall call = [&](const std::string& replica, const std::vector<size_t>& items,
                            absl::Duration call_timeout) -> absl::Status {
    v1::ResumeStepsRequest part;
    const bool whole = items.size() == names.size();
    if (!whole) {
      for (size_t i : items) *part.add_items() = request.items(i);
    }
    const v1::ResumeStepsRequest& sent = whole ? request : part;
    absl::StatusOr<v1::ResumeStepsResponse> answer =
        Unary(*stub_, &v1::QParamsService::Stub::ResumeSteps, sent, call_timeout, authorization_,
              /*session=*/"", replica);
    if (!answer.ok()) return answer.status();
    if (answer->statuses_size() != sent.items_size()) {
      return absl::InternalError(absl::StrCat("ResumeSteps answered ", answer->statuses_size(),
                                              " of ", sent.items_size(), " items"));
    }
    int k = 0;
    for (size_t i : items)
      *response.mutable_statuses(i) = std::move(*answer->mutable_statuses(k++));
    return absl::OkStatus();
  };
  const absl::Status sent = SendItems(
      names, call, [&](size_t i) { return response.mutable_statuses(i); }, timeout_,
      absl::InfiniteFuture());
  if (!sent.ok()) return sent;
  return response;
}

absl::Status Client::SendItems(const std::vector<std::string>& names, const ItemCall& call,
                               const ItemStatus& status, absl::Duration attempt_timeout,
                               absl::Time deadline) {
  // A call of no items still goes, so that the server judges the rest of it.
  if (names.empty()) return call(router_->replica(), {}, attempt_timeout);

  absl::Mutex mu;
  std::map<std::string, absl::Status> failed;  // by replica; guarded by mu
  bool split = false;                          // set by each attempt before its calls start
  // One call to `replica` with `items`; a `first` call's items refused naming another
  // owner then go to that owner at once, concurrently, once each (as Unary's retry).
  std::function<void(const std::string&, const std::vector<size_t>&, bool)> send =
      [&](const std::string& replica, const std::vector<size_t>& items, bool first) {
        const absl::Duration left = std::min(attempt_timeout, deadline - absl::Now());
        absl::Status sent =
            left > absl::ZeroDuration()
                ? call(replica, items, left)
                : absl::DeadlineExceededError("the deadline passed between attempts");
        // Calls addressed by owner name their replica, as the split observations do.
        const bool named = split || !first;
        if (!sent.ok()) {
          if (named) sent = FromReplica(replica, sent);
          const v1::RpcStatus item_status = wire::ToRpcStatus(sent);
          for (size_t i : items) *status(i) = item_status;
          // Refusals naming another owner may have waited in that call behind reads
          // until the deadline: the next call routes by a topology read afresh.
          if (named && absl::IsDeadlineExceeded(sent) && router_->Reroutes()) {
            router_->Refresh().IgnoreError();
          }
          absl::MutexLock lock(&mu);
          failed[replica] = sent;
          return;
        }
        if (!first || !router_->Reroutes()) return;
        Parts moved;  // by the owner the refusal names
        for (size_t i : items) {
          const v1::RpcStatus& answered = *status(i);
          if (answered.code() == static_cast<int>(absl::StatusCode::kFailedPrecondition) &&
              !answered.owner().empty()) {
            moved[answered.owner()].push_back(i);
          }
        }
        if (moved.empty()) return;
        // The next calls route by the new map; these go by the refusals' owners either way.
        router_->Refresh().IgnoreError();
        SendConcurrently(moved, [&send](const std::string& owner, const std::vector<size_t>& part) {
          send(owner, part, /*first=*/false);
        });
      };

  std::vector<size_t> pending(names.size());
  std::iota(pending.begin(), pending.end(), 0);
  Backoff backoff(std::min(retry_total_, deadline - absl::Now()), retry_initial_backoff_,
                  retry_max_backoff_);
  while (true) {
    {
      absl::MutexLock lock(&mu);
      // A call that failed as retried calls do is judged by its items' next attempt.
      for (auto it = failed.begin(); it != failed.end();) {
        it = SendAgain(it->second) ? failed.erase(it) : std::next(it);
      }
    }
    std::vector<std::string> pending_names;
    pending_names.reserve(pending.size());
    for (size_t i : pending) pending_names.push_back(names[i]);
    absl::StatusOr<std::vector<std::string>> owners = router_->Owners(pending_names);
    if (!owners.ok()) {
      if (SendAgain(owners.status()) && backoff.Wait()) continue;
      return owners.status();
    }
    split = !owners->empty();
    Parts parts;
    for (size_t k = 0; k < pending.size(); ++k) {
      parts[split ? (*owners)[k] : router_->replica()].push_back(pending[k]);
    }
    SendConcurrently(parts, [&send](const std::string& replica, const std::vector<size_t>& part) {
      send(replica, part, /*first=*/true);
    });
    std::vector<size_t> again;
    for (size_t i : pending) {
      if (SendAgain(*status(i))) again.push_back(i);
    }
    if (again.empty() || !backoff.Wait()) break;
    pending = std::move(again);
  }
  absl::MutexLock lock(&mu);
  if (!failed.empty()) return failed.begin()->second;
  return absl::OkStatus();
}

}  // namespace qparams
