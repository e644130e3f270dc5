// What this process holds, for tests of resource limits (src/engine/limits_test.cc,
// src/embed/service/limits_test.cc): its threads (/proc/self/task) and its resident memory
// (VmRSS in /proc/self/status), and a wait for a condition with a bound.
//
// Thread safety: plain functions.
#pragma once

#include <dirent.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

namespace ferry::testing {

// Resident memory a sanitizer adds on its own as a test runs: ASan keeps freed blocks in its
// quarantine (256 MiB by default) and both it and TSan map shadow memory as memory is touched,
// so a bound on resident growth holds there only with this much more room.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FERRY_TESTING_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FERRY_TESTING_SANITIZED 1
#endif
#ifdef FERRY_TESTING_SANITIZED
inline constexpr uint64_t kSanitizerRssSlack = uint64_t{512} << 20;
#else
inline constexpr uint64_t kSanitizerRssSlack = 0;
#endif

// Threads of this process; -1 when /proc cannot be read.
// Tests compare it with EXPECT_LE against a baseline: a thread of an engine that a helper made
// and destroyed just before may still be on its way out when the baseline is taken (seen: 6
// then 5), so only growth counts.
inline int ThreadCount() {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

// This process's resident memory in bytes (VmRSS); 0 when /proc cannot be read.
inline uint64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string word;
  while (status >> word) {
    if (word == "VmRSS:") {
      uint64_t kib = 0;
      status >> kib;
      return kib << 10;
    }
  }
  return 0;
}

// Whether `pred` holds within `limit`, asking every 2 ms.
template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

}  // namespace ferry::testing
