// PollPacer: when a waiter polls again, for work that completes only when polled (GPU copies
// tracked by CUDA events). It polls without sleeping until `spin` has passed since it began
// (the caller yields between polls), then sleeps between polls: 2 us, doubling to 50 us.
//
// Thread safety: a value, used by one waiter.
#pragma once

#include <algorithm>
#include <chrono>

#include "base/deadline.h"

namespace ferry {

class PollPacer {
 public:
  static constexpr Clock::duration kFirstSleep = std::chrono::microseconds(2);
  static constexpr Clock::duration kLongestSleep = std::chrono::microseconds(50);

  PollPacer(Clock::time_point start, Clock::duration spin)
      : spin_until_(spin > Clock::duration::zero() ? start + spin : start) {}

  // Whether a poll at `now` falls in the spin: the next one follows at once.
  bool Spinning(Clock::time_point now) const { return now < spin_until_; }

  // When to poll next after a poll at `now`: `now` while spinning, later once the spin is over
  // (each call after it sleeps longer, up to kLongestSleep).
  Clock::time_point Next(Clock::time_point now) {
    if (Spinning(now)) return now;
    const Clock::time_point at = now + sleep_;
    sleep_ = std::min<Clock::duration>(sleep_ * 2, kLongestSleep);
    return at;
  }

 private:
  Clock::time_point spin_until_;
  Clock::duration sleep_ = kFirstSleep;
};

}  // namespace ferry
