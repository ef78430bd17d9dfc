// Process-wide settings a qparams server runs best with. They change the whole
// process, so only a main() applies them (qparams-server, qparams-bench), before
// starting any thread; tests keep the library defaults.

#ifndef QPARAMS_SERVER_PROCESS_TUNING_H_
#define QPARAMS_SERVER_PROCESS_TUNING_H_

namespace qparams {

// - glibc malloc serves buffers of up to 256 MiB from its heaps and keeps up to
//   256 MiB of freed memory instead of returning it to the kernel. By default every
//   buffer over 32 MiB (and, adaptively, smaller ones) is a fresh mmap whose pages
//   fault in on first touch: a large tensor's receive, parse and range pass then
//   spend most of their time in page faults (10x slower for 32 MiB in a VM).
// - One malloc arena per core instead of eight: a buffer freed after one call is
//   reused by the next call on another thread while still in cache, instead of
//   waiting in the arena of a thread gRPC may not run again soon (1 MiB Observe at
//   concurrency 8: 84-87% -> 95% of the echo server's throughput; small requests
//   unchanged).
// - absl::Mutex deadlock detection off: Debian builds Abseil without NDEBUG, which
//   leaves the detector on and makes every lock, gRPC's included, update a global
//   lock graph under a global mutex.
void TuneProcessForServing();

}  // namespace qparams

#endif  // QPARAMS_SERVER_PROCESS_TUNING_H_
