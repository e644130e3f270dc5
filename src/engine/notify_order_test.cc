// A write batch's notification follows the data of every write the session posted before it,
// whatever order the batches complete in (lanes, workers and copy engines finish them out of
// order). The transport here is `local` behind an interposer that holds every batch until the
// test releases it (testing/held_transport.h), so the completion order is the test's.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "testing/held_engines.h"

namespace ferry::internal {
namespace {

using namespace std::chrono_literals;

class NotifyOrderTest : public HeldEnginesTest {
 protected:
  NotifyOrderTest() : HeldEnginesTest(kOneSession) {}

  // Writes layer `i` (kLayer bytes at i * kLayer on both sides) through the one session.
  Transfer WriteLayer(int i, std::optional<std::string> note = std::nullopt, Duration deadline = 10s) {
    TransferOptions o;
    o.notification = std::move(note);
    o.deadline = deadline;
    return HeldEnginesTest::WriteLayer(i, o);
  }
  size_t HeldCount() { return held().count(); }
  // Runs (or fails) the i-th batch held (posting order among those still held).
  void Release(size_t i, Status fail = Status::Ok()) { ASSERT_TRUE(held().Release(i, std::move(fail))); }
};

// Layer-by-layer pushes, the last carrying the notification, completing last layer first.
TEST_F(NotifyOrderTest, ANotificationWaitsForTheSessionsEarlierWrites) {
  std::vector<Transfer> layers;
  for (int i = 0; i < 3; ++i) layers.push_back(WriteLayer(i));
  Transfer last = WriteLayer(3, "request-7 done");
  ASSERT_EQ(HeldCount(), 4u);
  Release(3);  // the notifying batch's data lands first
  EXPECT_TRUE(LayerInPlace(3));
  EXPECT_TRUE(NotesWithin(50ms).empty()) << "the notification overtook earlier layers";
  EXPECT_FALSE(last.Test());
  Release(1);
  Release(0);
  EXPECT_TRUE(NotesWithin(50ms).empty()) << "the notification overtook layer 2";
  Release(0);  // layer 2, the last one held
  ASSERT_TRUE(last.Wait().ok()) << last.status().ToString();
  for (auto& t : layers) EXPECT_TRUE(t.Wait().ok());
  auto notes = NotesWithin(2s);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].message, "request-7 done");
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(LayerInPlace(i)) << "layer " << i;
}

// Writes that finished before the notifying batch was posted do not hold it; later writes
// do not either.
TEST_F(NotifyOrderTest, OnlyWritesPostedBeforeTheBatchAreWaitedFor) {
  Transfer done = WriteLayer(0);
  Release(0);
  ASSERT_TRUE(done.Wait().ok());
  Transfer note = WriteLayer(1, "n");
  Transfer after = WriteLayer(2);
  Release(0);  // the notifying batch; the later write stays held
  ASSERT_TRUE(note.Wait().ok()) << note.status().ToString();
  EXPECT_EQ(NotesWithin(2s).size(), 1u);
  EXPECT_FALSE(after.Test());
  Release(0);
  EXPECT_TRUE(after.Wait().ok());
}

// An earlier write that fails: the notification is never sent (the receiver would take it to
// mean the data is complete) and the batch fails with the earlier write's error.
TEST_F(NotifyOrderTest, AnEarlierWriteThatFailsCancelsTheNotification) {
  Transfer layer0 = WriteLayer(0);
  Transfer layer1 = WriteLayer(1, "never");
  Release(1);
  Release(0, Status(Code::kUnavailable, "the link went down"));
  EXPECT_EQ(layer0.Wait().code(), Code::kUnavailable);
  Status s = layer1.Wait();
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("earlier write"), std::string_view::npos) << s.ToString();
  EXPECT_TRUE(NotesWithin(100ms).empty());
  // The session still works.
  Transfer again = WriteLayer(2, "after");
  Release(0);
  ASSERT_TRUE(again.Wait().ok()) << again.status().ToString();
  EXPECT_EQ(NotesWithin(2s).size(), 1u);
}

// An earlier write that never completes: the notifying batch ends at its own deadline and no
// notification is sent, even when the earlier write completes later.
TEST_F(NotifyOrderTest, AStalledEarlierWriteEndsTheBatchAtItsDeadline) {
  Transfer stalled = WriteLayer(0);
  Transfer note = WriteLayer(1, "late", 200ms);
  Release(1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(note.Wait().code(), Code::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  Release(0);
  EXPECT_TRUE(stalled.Wait().ok());
  EXPECT_TRUE(NotesWithin(100ms).empty()) << "a notification left after its batch had ended";
}

}  // namespace
}  // namespace ferry::internal
