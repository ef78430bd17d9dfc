#include "server/process_tuning.h"

#include <malloc.h>

#include <algorithm>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace qparams {

void TuneProcessForServing() {
  constexpr int kLargeBufferBytes = 256 << 20;
  mallopt(M_MMAP_THRESHOLD, kLargeBufferBytes);
  mallopt(M_TRIM_THRESHOLD, kLargeBufferBytes);
  mallopt(M_ARENA_MAX, std::max(1u, std::thread::hardware_concurrency()));
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace qparams
