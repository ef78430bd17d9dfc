#include "domain/step_timer.h"

#include <utility>
#include <vector>

namespace qparams {

StepTimer::StepTimer(Expire expire) : expire_(std::move(expire)), thread_([this] { Run(); }) {}

StepTimer::~StepTimer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StepTimer::Arm(const SessionKey& key, int64_t step, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  if (!armed_.try_emplace(std::make_tuple(key.tenant, key.name, step), deadline).second) return;
  due_.emplace(deadline, Entry{key, step, timeout});
}

int64_t StepTimer::armed() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(armed_.size());
}

void StepTimer::Run() {
  mu_.Lock();
  while (!stopping_) {
    const absl::Time next = due_.empty() ? absl::InfiniteFuture() : due_.begin()->first;
    // Woken by an earlier arming (the condition sees the new head) or a stop.
    auto changed = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (!due_.empty() && due_.begin()->first < next);
    };
    if (mu_.AwaitWithDeadline(absl::Condition(&changed), next)) continue;
    std::vector<Entry> expired;
    const absl::Time now = absl::Now();
    while (!due_.empty() && due_.begin()->first <= now) {
      Entry entry = std::move(due_.begin()->second);
      due_.erase(due_.begin());
      armed_.erase(std::make_tuple(entry.key.tenant, entry.key.name, entry.step));
      expired.push_back(std::move(entry));
    }
    mu_.Unlock();
    for (const Entry& entry : expired) expire_(entry.key, entry.step, entry.timeout);
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace qparams
