#include "domain/step_timer.h"

#include <utility>
#include <vector>

namespace qparams {

StepTimer::StepTimer(Expire expire) : expire_(std::move(expire)), thread_([this] { Run(); }) {}

StepTimer::~StepTimer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.Signal();
  }
  thread_.join();
}

void StepTimer::Arm(const SessionKey& key, int64_t step, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  Key session(key.tenant, key.name);
  auto [it, fresh] = armed_.try_emplace(session, Armed{step, deadline});
  if (!fresh) {
    if (it->second.step == step) return;
    EraseDue(session, it->second.deadline);
    it->second = Armed{step, deadline};
  }
  due_.emplace(deadline, Entry{key, step, timeout});
  cv_.Signal();  // it may be the earliest now
}

void StepTimer::Disarm(const SessionKey& key) {
  absl::MutexLock lock(&mu_);
  Key session(key.tenant, key.name);
  auto it = armed_.find(session);
  if (it == armed_.end()) return;
  EraseDue(session, it->second.deadline);
  armed_.erase(it);
}

void StepTimer::EraseDue(const Key& key, absl::Time deadline) {
  auto [first, last] = due_.equal_range(deadline);
  for (auto it = first; it != last; ++it) {
    if (it->second.key.tenant == key.first && it->second.key.name == key.second) {
      due_.erase(it);
      return;
    }
  }
}

int64_t StepTimer::armed() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(armed_.size());
}

void StepTimer::Run() {
  // CondVar waits rather than Mutex::Await: the sanitizers' model of the
  // uninstrumented Abseil (sanitizers/tsan_absl_sync.cc) sees these reads under the lock.
  mu_.Lock();
  while (!stopping_) {
    if (due_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    if (const absl::Time next = due_.begin()->first; absl::Now() < next) {
      cv_.WaitWithDeadline(&mu_, next);
      continue;
    }
    std::vector<Entry> expired;
    const absl::Time now = absl::Now();
    while (!due_.empty() && due_.begin()->first <= now) {
      Entry entry = std::move(due_.begin()->second);
      due_.erase(due_.begin());
      armed_.erase(Key(entry.key.tenant, entry.key.name));
      expired.push_back(std::move(entry));
    }
    mu_.Unlock();
    for (const Entry& entry : expired) expire_(entry.key, entry.step, entry.timeout);
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace qparams
