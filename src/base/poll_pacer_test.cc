#include "base/poll_pacer.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(PollPacer, PollsAtOnceUntilTheSpinIsOverThenSleepsLongerEachTime) {
  const Clock::time_point t0 = Clock::time_point() + std::chrono::seconds(100);
  PollPacer pacer(t0, milliseconds(2));
  for (auto at : {microseconds(0), microseconds(5), microseconds(1999)}) {
    EXPECT_TRUE(pacer.Spinning(t0 + at));
    EXPECT_EQ(pacer.Next(t0 + at), t0 + at);  // no sleep: the caller yields and polls again
  }
  const Clock::time_point after = t0 + milliseconds(2);
  EXPECT_FALSE(pacer.Spinning(after));
  const microseconds want[] = {microseconds(2), microseconds(4), microseconds(8), microseconds(16),
                               microseconds(32), microseconds(50), microseconds(50), microseconds(50)};
  for (microseconds w : want) EXPECT_EQ(pacer.Next(after), after + w);
}

TEST(PollPacer, NoSpinSleepsFromTheFirstPoll) {
  const Clock::time_point t0 = Clock::time_point() + std::chrono::seconds(100);
  for (Clock::duration spin : {Clock::duration::zero(), Clock::duration(-5)}) {
    PollPacer pacer(t0, spin);
    EXPECT_FALSE(pacer.Spinning(t0));
    EXPECT_EQ(pacer.Next(t0), t0 + PollPacer::kFirstSleep);
  }
}

}  // namespace
}  // namespace ferry
