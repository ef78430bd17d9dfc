// TSan annotations for Abseil's synchronization primitives, linked into every
// executable of a -DQPARAMS_SANITIZE=thread build (cmake/hardening.cmake).
//
// Debian's libabsl_synchronization.so is not built with TSan, so the lock and unlock
// of an absl::Mutex are invisible to it: every field guarded by one (the session
// store, each session, gRPC's own queues) would look racy. These definitions take
// the place of the library's exported ones (the executable's symbols come first,
// for our code and for gRPC's calls through the PLT alike), tell TSan what each one
// does with __tsan_mutex_* annotations, and call the library's own through dlsym.
//
// Modelled: Lock/ReaderLock/TryLock/ReaderTryLock/*LockWhen* as acquisitions,
// Unlock/ReaderUnlock as releases, Await* and CondVar::Wait* as a release and a
// reacquisition, Notification::Notify/WaitForNotification* as release/acquire.
// Not modelled: a Condition evaluated by another thread (Abseil may run it on the
// unlocking thread), the inline Notification::HasBeenNotified fast path, and
// destruction (__tsan_mutex_destroy): gRPC destroys its objects' mutexes after
// hand-offs made in uninstrumented code, which would look like races; ASan covers
// a use after destruction.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define QP_STR2(x) #x
#define QP_STR(x) QP_STR2(x)

// The Itanium-mangled prefix of absl's (inline) namespace, e.g. "4absl7debian3".
std::string AbslPrefix() {
  std::string prefix = "4absl";
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const std::string ns = QP_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  prefix += std::to_string(ns.size()) + ns;
#endif
  return prefix;
}

// The library's definition of the function whose mangled name is
// "_ZN" [K] <absl prefix> <rest>: the next one after ours.
void* Next(bool const_member, const char* rest) {
  const std::string name = std::string(const_member ? "_ZNK" : "_ZN") + AbslPrefix() + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return fn;
}

// Looks the real function up once (the static is initialised thread-safely).
#define QP_REAL(type, const_member, rest) \
  static const auto real = reinterpret_cast<type>(Next(const_member, rest))

// The mutexes this thread holds in reader mode, so that a wait (which releases and
// reacquires in the mode held) is annotated with the right flags. A plain array: a
// thread holds few locks at once, and more than fit are treated as writer locks.
constexpr int kMaxReaderLocks = 32;
thread_local const void* reader_locks[kMaxReaderLocks];
thread_local int reader_lock_count = 0;

void PushReader(const void* mu) {
  if (reader_lock_count < kMaxReaderLocks) reader_locks[reader_lock_count++] = mu;
}

void PopReader(const void* mu) {
  for (int i = reader_lock_count; i-- > 0;) {
    if (reader_locks[i] == mu) {
      reader_locks[i] = reader_locks[--reader_lock_count];
      return;
    }
  }
}

unsigned HeldFlags(const void* mu) {
  for (int i = 0; i < reader_lock_count; ++i) {
    if (reader_locks[i] == mu) return __tsan_mutex_read_lock;
  }
  return 0;
}

// Interposed functions call each other inside the library (LockWhenWithTimeout calls
// LockWhenWithDeadline, Notification::Notify calls Lock and Unlock, ...): only the
// outermost call of a thread is annotated, so that no operation is counted twice.
thread_local int depth = 0;

class Outermost {
 public:
  Outermost() : outermost_(depth++ == 0) {}
  ~Outermost() { --depth; }
  explicit operator bool() const { return outermost_; }

 private:
  const bool outermost_;
};

// A wait that releases `mu` and holds it again on return.
template <typename Fn>
auto AroundWait(void* mu, Fn&& wait) {
  const unsigned flags = HeldFlags(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
  auto result = wait();
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// ---- Mutex ----

void Mutex::Lock() {
  QP_REAL(void (*)(Mutex*), false, "5Mutex4LockEv");
  Outermost outermost;
  if (!outermost) return real(this);
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLock() {
  QP_REAL(void (*)(Mutex*), false, "5Mutex10ReaderLockEv");
  Outermost outermost;
  if (!outermost) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  PushReader(this);
}

bool Mutex::TryLock() {
  QP_REAL(bool (*)(Mutex*), false, "5Mutex7TryLockEv");
  Outermost outermost;
  if (!outermost) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

bool Mutex::ReaderTryLock() {
  QP_REAL(bool (*)(Mutex*), false, "5Mutex13ReaderTryLockEv");
  Outermost outermost;
  if (!outermost) return real(this);
  const unsigned flags = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(this, flags);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, flags | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  if (locked) PushReader(this);
  return locked;
}

void Mutex::Unlock() {
  QP_REAL(void (*)(Mutex*), false, "5Mutex6UnlockEv");
  Outermost outermost;
  if (!outermost) return real(this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  QP_REAL(void (*)(Mutex*), false, "5Mutex12ReaderUnlockEv");
  Outermost outermost;
  if (!outermost) return real(this);
  PopReader(this);
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) {
  QP_REAL(void (*)(Mutex*, const Condition&), false, "5Mutex8LockWhenERKNS0_9ConditionE");
  Outermost outermost;
  if (!outermost) return real(this, cond);
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  QP_REAL(void (*)(Mutex*, const Condition&), false, "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Outermost outermost;
  if (!outermost) return real(this, cond);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this, cond);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  PushReader(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  QP_REAL(bool (*)(Mutex*, const Condition&, absl::Duration), false,
          "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outermost;
  if (!outermost) return real(this, cond, timeout);
  __tsan_mutex_pre_lock(this, 0);
  const bool result = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, 0, 0);  // held on return either way
  return result;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  QP_REAL(bool (*)(Mutex*, const Condition&, absl::Time), false,
          "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outermost;
  if (!outermost) return real(this, cond, deadline);
  __tsan_mutex_pre_lock(this, 0);
  const bool result = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, 0, 0);
  return result;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  QP_REAL(bool (*)(Mutex*, const Condition&, absl::Duration), false,
          "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outermost;
  if (!outermost) return real(this, cond, timeout);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  const bool result = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  PushReader(this);
  return result;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  QP_REAL(bool (*)(Mutex*, const Condition&, absl::Time), false,
          "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outermost;
  if (!outermost) return real(this, cond, deadline);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  const bool result = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
  PushReader(this);
  return result;
}

void Mutex::Await(const Condition& cond) {
  QP_REAL(void (*)(Mutex*, const Condition&), false, "5Mutex5AwaitERKNS0_9ConditionE");
  Outermost outermost;
  if (!outermost) return real(this, cond);
  AroundWait(this, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  QP_REAL(bool (*)(Mutex*, const Condition&, absl::Duration), false,
          "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Outermost outermost;
  if (!outermost) return real(this, cond, timeout);
  return AroundWait(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  QP_REAL(bool (*)(Mutex*, const Condition&, absl::Time), false,
          "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Outermost outermost;
  if (!outermost) return real(this, cond, deadline);
  return AroundWait(this, [&] { return real(this, cond, deadline); });
}

// ---- CondVar ----

void CondVar::Wait(Mutex* mu) {
  QP_REAL(void (*)(CondVar*, Mutex*), false, "7CondVar4WaitEPNS0_5MutexE");
  Outermost outermost;
  if (!outermost) return real(this, mu);
  AroundWait(mu, [&] {
    real(this, mu);
    return 0;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  QP_REAL(bool (*)(CondVar*, Mutex*, absl::Duration), false,
          "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Outermost outermost;
  if (!outermost) return real(this, mu, timeout);
  return AroundWait(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  QP_REAL(bool (*)(CondVar*, Mutex*, absl::Time), false,
          "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Outermost outermost;
  if (!outermost) return real(this, mu, deadline);
  return AroundWait(mu, [&] { return real(this, mu, deadline); });
}

// ---- Notification ----

void Notification::Notify() {
  QP_REAL(void (*)(Notification*), false, "12Notification6NotifyEv");
  Outermost outermost;
  if (!outermost) return real(this);
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  QP_REAL(void (*)(const Notification*), true, "12Notification19WaitForNotificationEv");
  Outermost outermost;
  if (!outermost) return real(this);
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  QP_REAL(bool (*)(const Notification*, absl::Duration), true,
          "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  Outermost outermost;
  if (!outermost) return real(this, timeout);
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  QP_REAL(bool (*)(const Notification*, absl::Time), true,
          "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  Outermost outermost;
  if (!outermost) return real(this, deadline);
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
