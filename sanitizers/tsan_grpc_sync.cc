// TSan annotations for gRPC's completion hand-off, linked into every executable of a
// -DQPARAMS_SANITIZE=thread build next to tsan_absl_sync.cc (cmake/hardening.cmake).
//
// gRPC's C++ API (header code, compiled into our objects and so instrumented) starts
// a batch of operations on one thread and finishes it (CallOpSet::FinalizeResult,
// then the reactor's callback) on whichever thread gRPC core completes it. Core is
// Debian's uninstrumented libgrpc, whose lock-free queues TSan cannot see, so every
// field of an op set written before the batch and read after it looks racy. These
// definitions take the place of libgrpc's exported functions (libgrpc++ calls them
// through the PLT) and add the edge that core guarantees:
//
//   grpc_call_start_batch(tag)        release on the tag
//   grpc_completion_queue_next/pluck  acquire on the tag of the event returned
//   a callback-API tag's functor      acquire on the tag before it runs
//
// A callback-API tag is a grpc_completion_queue_functor (gRPC's
// CallbackWithSuccessTag); its functor_run is swapped for a trampoline that acquires
// and then calls the original. Other tags (op sets, with a vtable pointer where a
// functor has functor_run) are left alone.

#include <dlfcn.h>
#include <grpc/grpc.h>
#include <grpc/impl/codegen/grpc_types.h>
#include <sanitizer/tsan_interface.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace {

template <typename Fn>
Fn Next(const char* name) {
  void* fn = dlsym(RTLD_NEXT, name);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_grpc_sync: %s not found: %s\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// Tags are objects; anything else (a small integer) is not touched.
bool Plausible(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  return u >= 4096 && u % alignof(void*) == 0;
}

using FunctorRun = void (*)(grpc_completion_queue_functor*, int);

// The originals a trampoline calls, one slot each, filled as they are met (gRPC has
// one or two: CallbackWithSuccessTag::StaticRun, as instantiated in each module).
constexpr int kSlots = 8;
std::atomic<FunctorRun> originals[kSlots];

template <int I>
void RunAcquired(grpc_completion_queue_functor* functor, int ok) {
  __tsan_acquire(functor);
  originals[I].load(std::memory_order_relaxed)(functor, ok);
}

template <int... I>
constexpr std::array<FunctorRun, sizeof...(I)> MakeTrampolines(std::integer_sequence<int, I...>) {
  return {&RunAcquired<I>...};
}
constexpr auto kTrampolines = MakeTrampolines(std::make_integer_sequence<int, kSlots>());

bool IsTrampoline(FunctorRun run) {
  for (FunctorRun t : kTrampolines) {
    if (t == run) return true;
  }
  return false;
}

// The trampoline of `original`, or null once the slots are full.
FunctorRun TrampolineFor(FunctorRun original) {
  for (int i = 0; i < kSlots; ++i) {
    FunctorRun current = originals[i].load(std::memory_order_relaxed);
    if (current == nullptr &&
        originals[i].compare_exchange_strong(current, original, std::memory_order_relaxed)) {
      return kTrampolines[i];
    }
    if (current == original) return kTrampolines[i];
  }
  return nullptr;
}

// Whether `p` is the address of a callback-API functor_run (CallbackWithSuccessTag::
// StaticRun or the like) rather than, say, a vtable pointer. Answers are cached:
// the values met are few (one vtable per op-set type).
bool IsFunctorRun(const void* p) {
  constexpr int kCache = 128;
  static std::atomic<const void*> yes[kCache], no[kCache];
  for (int i = 0; i < kCache; ++i) {
    const void* y = yes[i].load(std::memory_order_relaxed);
    const void* n = no[i].load(std::memory_order_relaxed);
    if (y == p) return true;
    if (n == p) return false;
    if (y == nullptr && n == nullptr) break;
  }
  Dl_info info;
  const bool functor = dladdr(p, &info) != 0 && info.dli_saddr == p && info.dli_sname != nullptr &&
                       std::strstr(info.dli_sname, "StaticRun") != nullptr;
  std::atomic<const void*>* cache = functor ? yes : no;
  for (int i = 0; i < kCache; ++i) {
    const void* expected = nullptr;
    if (cache[i].compare_exchange_strong(expected, p, std::memory_order_relaxed) ||
        expected == p) {
      break;
    }
  }
  return functor;
}

void AcquireEventTag(const grpc_event& event) {
  if (event.type == GRPC_OP_COMPLETE && Plausible(event.tag)) __tsan_acquire(event.tag);
}

}  // namespace

extern "C" grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops,
                                                 void* tag, void* reserved) {
  static const auto real =
      Next<grpc_call_error (*)(grpc_call*, const grpc_op*, size_t, void*, void*)>(
          "grpc_call_start_batch");
  if (Plausible(tag)) {
    auto* functor = static_cast<grpc_completion_queue_functor*>(tag);
    const FunctorRun run = functor->functor_run;
    if (!IsTrampoline(run) && IsFunctorRun(reinterpret_cast<const void*>(run))) {
      if (FunctorRun trampoline = TrampolineFor(run)) functor->functor_run = trampoline;
    }
    __tsan_release(tag);
  }
  return real(call, ops, nops, tag, reserved);
}

extern "C" grpc_event grpc_completion_queue_next(grpc_completion_queue* cq, gpr_timespec deadline,
                                                 void* reserved) {
  static const auto real =
      Next<grpc_event (*)(grpc_completion_queue*, gpr_timespec, void*)>(
          "grpc_completion_queue_next");
  const grpc_event event = real(cq, deadline, reserved);
  AcquireEventTag(event);
  return event;
}

extern "C" grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag,
                                                  gpr_timespec deadline, void* reserved) {
  static const auto real =
      Next<grpc_event (*)(grpc_completion_queue*, void*, gpr_timespec, void*)>(
          "grpc_completion_queue_pluck");
  const grpc_event event = real(cq, tag, deadline, reserved);
  AcquireEventTag(event);
  return event;
}
