// The step timeouts of step-merged sessions (shared/docs/qat.md §6): a step left
// open is closed with what it has once its timeout expires, so that a rank that
// stopped contributing does not stall its run. One background thread waits for the
// earliest deadline and hands each due (session, step) to a callback.
//
// Thread safety: Arm may be called from any thread. The callback runs on the timer's
// thread, never under the timer's lock, one at a time; the destructor lets the
// callbacks of deadlines already due finish and drops the armed ones.

#ifndef QPARAMS_DOMAIN_STEP_TIMER_H_
#define QPARAMS_DOMAIN_STEP_TIMER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/session_codec.h"

namespace qparams {

class StepTimer {
 public:
  // Called for each armed (session, step) once its deadline has passed, with the
  // timeout it was armed with (for the next step it arms).
  using Expire = std::function<void(const SessionKey& key, int64_t step, absl::Duration timeout)>;

  explicit StepTimer(Expire expire);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  // Closes step `step` of `key` at now + `timeout` unless that step is armed already
  // (the first arming of a step wins: its timeout runs from the step's first
  // contribution). A session has at most one armed step, its lowest open one: arming
  // another replaces it, so a run's applied steps leave nothing behind.
  void Arm(const SessionKey& key, int64_t step, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `key`'s armed step, if any (it has no open step left).
  void Disarm(const SessionKey& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Sessions with an armed step (for tests and metrics).
  int64_t armed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    SessionKey key;
    int64_t step;
    absl::Duration timeout;
  };
  struct Armed {
    int64_t step;
    absl::Time deadline;
  };
  using Key = std::pair<std::string, std::string>;  // (tenant, name)
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `key`'s entry of due_ due at `deadline`.
  void EraseDue(const Key& key, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Expire expire_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // an earlier deadline, or stopping
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::multimap<absl::Time, Entry> due_ ABSL_GUARDED_BY(mu_);
  // Each session's armed step and its deadline (its entry of due_).
  absl::flat_hash_map<Key, Armed> armed_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_STEP_TIMER_H_
