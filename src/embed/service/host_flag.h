// Flag words in shared host memory (the CPU-only mode): release stores, acquire loads and a
// host-side wait with a deadline. The word may be written by another process, so accesses go
// through std::atomic_ref on the mapped memory (lock-free for uint32_t on every target ferry
// builds for).
//
// Thread safety: any thread of any process mapping the word.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "base/deadline.h"
#include "embed/service/protocol.h"
#include "ferry/status.h"

namespace ferry::embed::service {

static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

inline uint32_t LoadFlag(uint32_t* word) {
  return std::atomic_ref<uint32_t>(*word).load(std::memory_order_acquire);
}
inline void StoreFlag(uint32_t* word, uint32_t value) {
  std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release);
}

// Waits until pred(value) holds; returns the value, or kDeadlineExceeded. Spins, then yields
// for up to 200 us (a decode step's DONE follows its request by about that much), then sleeps
// in short steps (a sleep costs the timer slack, about 50 us, in latency).
template <typename Pred>
Result<uint32_t> WaitFlag(uint32_t* word, Deadline deadline, Pred pred) {
  const auto yield_until = Clock::now() + std::chrono::microseconds(200);
  for (int spin = 0;; ++spin) {
    uint32_t v = LoadFlag(word);
    if (pred(v)) return v;
    if (spin < 256) continue;
    if (deadline.expired()) {
      v = LoadFlag(word);
      if (pred(v)) return v;
      return Status(Code::kDeadlineExceeded, "flag wait passed its deadline");
    }
    if (Clock::now() < yield_until)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spin > 100000 ? 200 : 20));
  }
}

}  // namespace ferry::embed::service
