// StartThread: a std::thread whose failure to start (RLIMIT_NPROC, a container's pids.max,
// memory) is a Status, kResourceExhausted, instead of the std::system_error that would end the
// process.
//
// Tests may make the next starts fail (FailThreadStartsForTesting) to reach those paths.
//
// Thread safety: may be called from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "ferry/status.h"

namespace ferry::embed {

namespace internal {
inline std::atomic<int>& ThreadStartFailures() {
  static std::atomic<int> failures{0};
  return failures;
}
}  // namespace internal

// The next `count` StartThread calls fail with kResourceExhausted.
inline void FailThreadStartsForTesting(int count) { internal::ThreadStartFailures() = count; }

// Starts `fn` on a new thread; `what` names it in the error.
inline Result<std::thread> StartThread(const std::string& what, std::function<void()> fn) {
  int left = internal::ThreadStartFailures().load();
  while (left > 0 && !internal::ThreadStartFailures().compare_exchange_weak(left, left - 1)) {
  }
  if (left > 0)
    return Status(Code::kResourceExhausted, "cannot start the " + what + " thread (test)");
  try {
    return std::thread(std::move(fn));
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted,
                  "cannot start the " + what + " thread: " + std::string(e.what()));
  }
}

}  // namespace ferry::embed
