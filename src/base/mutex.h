// Mutex, MutexLock and CondVar: the locks of ferry, annotated so that clang's thread-safety
// analysis (-Wthread-safety, an error in the clang builds) checks every field marked
// GUARDED_BY(mu_) and every function marked REQUIRES(mu_) / EXCLUDES(mu_).
//
// libstdc++'s std::mutex carries no capability attributes, so a field guarded by one cannot be
// checked; Mutex is a std::mutex that can. The macros follow clang's documentation
// (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) and compile to nothing elsewhere.
//
//   class Queue {
//    public:
//     void Push(int v) EXCLUDES(mu_) { MutexLock l(&mu_); items_.push_back(v); cv_.NotifyOne(); }
//    private:
//     Mutex mu_;
//     CondVar cv_;
//     std::deque<int> items_ GUARDED_BY(mu_);
//   };
//
// Thread safety: Mutex and CondVar are for use by many threads at once; MutexLock is a scope.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define FERRY_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define FERRY_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) FERRY_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY FERRY_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) FERRY_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) FERRY_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) FERRY_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) FERRY_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) FERRY_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) FERRY_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) FERRY_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) FERRY_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) FERRY_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) FERRY_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) FERRY_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS FERRY_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace ferry {

class CondVar;

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the calling thread holds the mutex (e.g. in a callback that the
  // code holding it runs). Checks nothing at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable used with a Mutex the caller holds. Wakeups may be spurious: wait in a
// loop on the condition, or use the predicate forms. A predicate that reads guarded fields says
// so, for the analysis: `cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return done_; });`.
class CondVar {
 public:
  void Wait(Mutex* mu) REQUIRES(mu) {
    Adopt(mu, [&](std::unique_lock<std::mutex>& l) { cv_.wait(l); return true; });
  }
  template <typename Pred>
  void Wait(Mutex* mu, Pred pred) REQUIRES(mu) {
    Adopt(mu, [&](std::unique_lock<std::mutex>& l) { cv_.wait(l, pred); return true; });
  }
  // False when `until` passed first.
  template <typename Clock, typename Dur>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Dur> until) REQUIRES(mu) {
    return Adopt(mu, [&](std::unique_lock<std::mutex>& l) {
      return cv_.wait_until(l, until) == std::cv_status::no_timeout;
    });
  }
  // pred() at the end: false when `until` passed with pred() still false.
  template <typename Clock, typename Dur, typename Pred>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Dur> until, Pred pred) REQUIRES(mu) {
    return Adopt(mu, [&](std::unique_lock<std::mutex>& l) { return cv_.wait_until(l, until, pred); });
  }
  template <typename Rep, typename Period, typename Pred>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Pred pred) REQUIRES(mu) {
    return Adopt(mu, [&](std::unique_lock<std::mutex>& l) { return cv_.wait_for(l, timeout, pred); });
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  // Runs wait(lock) on the caller's held mutex, which stays held (and owned by the caller).
  template <typename F>
  static bool Adopt(Mutex* mu, F wait) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool r = wait(lock);
    lock.release();
    return r;
  }
  std::condition_variable cv_;
};

}  // namespace ferry
