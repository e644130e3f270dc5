// Deadline: a point on the steady clock after which a wait gives up. The clock is read through
// the OS seam (os::Env::SteadyNow), so a test can make it jump past a deadline.
//
// Thread safety: a value.
#pragma once

#include <chrono>

#include "base/os.h"

namespace ferry {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  Deadline() : at_(Clock::time_point::max()) {}
  static Deadline After(Clock::duration d) {
    Deadline out;
    auto now = Now();
    out.at_ = d >= Clock::time_point::max() - now ? Clock::time_point::max() : now + d;
    return out;
  }
  static Deadline At(Clock::time_point t) {
    Deadline out;
    out.at_ = t;
    return out;
  }
  Clock::time_point at() const { return at_; }
  bool expired() const { return Now() >= at_; }
  Clock::duration remaining() const {
    auto now = Now();
    return now >= at_ ? Clock::duration::zero() : at_ - now;
  }
  static Deadline Earlier(Deadline a, Deadline b) { return a.at_ < b.at_ ? a : b; }

 private:
  static Clock::time_point Now() { return os::Env::Current()->SteadyNow(); }
  Clock::time_point at_;
};

}  // namespace ferry
