// Ordering across sessions (TransferOptions::after, Engine::NotifyAfter) with batches that
// complete out of order, and notification topics at the engine layer.
#include <gtest/gtest.h>

#include <string>

#include "testing/held_engines.h"

namespace ferry::internal {
namespace {

using namespace std::chrono_literals;

using AfterTest = HeldEnginesTest;

// One session per layer: "request done" follows every layer's write, whatever order they
// complete in.
TEST_F(AfterTest, NotifyAfterFollowsTheWritesOfSeveralSessions) {
  std::vector<Transfer> layers;
  for (int i = 0; i < kLayers; ++i) layers.push_back(WriteLayer(i));
  Transfer done = a_->NotifyAfter(b_->key(), "request-7 done", layers, {});
  ASSERT_EQ(held().count(), 4u);
  ASSERT_TRUE(held().Release(3));
  ASSERT_TRUE(held().Release(0));
  ASSERT_TRUE(held().Release(1));
  EXPECT_TRUE(NotesWithin(50ms).empty()) << "the notification overtook a layer";
  EXPECT_FALSE(done.Test());
  ASSERT_TRUE(held().Release(0));  // layer 2, the last
  ASSERT_TRUE(done.Wait().ok()) << done.status().ToString();
  auto notes = NotesWithin(2s);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].message, "request-7 done");
  EXPECT_EQ(notes[0].from, a_->key());
  for (int i = 0; i < kLayers; ++i) EXPECT_TRUE(LayerInPlace(i)) << i;
}

// The last layer's write carries the notification, after the other sessions' writes.
TEST_F(AfterTest, AWriteNotificationFollowsTheTransfersItNames) {
  Transfer l0 = WriteLayer(0);
  Transfer l1 = WriteLayer(1);
  TransferOptions o;
  o.notification = "kv ready";
  o.notification_topic = "ferry.kv";
  o.after = {l0, l1};
  Transfer l2 = WriteLayer(2, o);
  ASSERT_TRUE(held().Release(2));  // layer 2's own data first
  ASSERT_TRUE(held().Release(1));  // then layer 1
  EXPECT_TRUE(NotesWithin(50ms, "ferry.kv").empty());
  EXPECT_FALSE(l2.Test());
  ASSERT_TRUE(held().Release(0));
  ASSERT_TRUE(l2.Wait().ok()) << l2.status().ToString();
  auto notes = NotesWithin(2s, "ferry.kv");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].message, "kv ready");
  EXPECT_EQ(notes[0].topic, "ferry.kv");
  EXPECT_TRUE(b_->PopNotifications("").empty()) << "a topic's notification reached the application";
}

TEST_F(AfterTest, AFailedTransferInAfterCancelsTheNotification) {
  Transfer l0 = WriteLayer(0);
  Transfer l1 = WriteLayer(1);
  std::vector<Transfer> layers{l0, l1};
  Transfer done = a_->NotifyAfter(b_->key(), "never", layers, {});
  ASSERT_TRUE(held().Release(1));
  ASSERT_TRUE(held().Release(0, Status(Code::kUnavailable, "the link went down")));
  Status s = done.Wait();
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("named in `after`"), std::string_view::npos) << s.ToString();
  EXPECT_TRUE(NotesWithin(100ms).empty());
  // A write ordered after a failed transfer fails too (its data still moved).
  TransferOptions o;
  o.after = {l0};
  Transfer l2 = WriteLayer(2, o);
  ASSERT_TRUE(held().Release(0));
  EXPECT_EQ(l2.Wait().code(), Code::kUnavailable);
  EXPECT_TRUE(LayerInPlace(2));
}

// A transfer in `after` that stalls past its own deadline fails the one that waits on it then,
// even though nobody waits on the stalled one.
TEST_F(AfterTest, AStalledTransferInAfterFailsAtItsDeadline) {
  TransferOptions quick;
  quick.deadline = 100ms;
  Transfer stalled = WriteLayer(0, quick);
  std::vector<Transfer> after{stalled};
  TransferOptions slow;
  slow.deadline = 10s;
  Transfer done = a_->NotifyAfter(b_->key(), "late", after, slow);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(done.Wait().code(), Code::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  ASSERT_TRUE(held().Release(0));
  EXPECT_TRUE(NotesWithin(100ms).empty()) << "a notification left after its transfer had failed";
}

// An empty batch with `after`: a notification through a session, ordered after other sessions.
TEST_F(AfterTest, AnEmptyBatchWithAfterIsANotificationThatFollowsThem) {
  Transfer l1 = WriteLayer(1);
  TransferOptions o;
  o.notification = "after layer 1";
  o.after = {l1};
  Transfer note = sessions_[0]->Post(Op::kWrite, std::span<const TransferOp>(), o);
  EXPECT_TRUE(NotesWithin(50ms).empty());
  ASSERT_TRUE(held().Release(0));
  ASSERT_TRUE(note.Wait().ok()) << note.status().ToString();
  EXPECT_EQ(NotesWithin(2s).size(), 1u);
}

TEST_F(AfterTest, BadArgumentsAreRefused) {
  std::vector<Transfer> empty(1);
  EXPECT_EQ(a_->NotifyAfter(b_->key(), "m", empty, {}).Wait().code(), Code::kInvalidArgument);
  TransferOptions o;
  o.after = {Transfer()};
  EXPECT_EQ(WriteLayer(0, o).Wait().code(), Code::kInvalidArgument);
  TransferOptions inline_message;
  inline_message.notification = "twice";
  EXPECT_EQ(a_->NotifyAfter(b_->key(), "m", {}, inline_message).Wait().code(), Code::kInvalidArgument);
  EXPECT_EQ(a_->NotifyAfter("nobody", "m", {}, {}).Wait().code(), Code::kFailedPrecondition);
  TransferOptions long_topic;
  long_topic.notification_topic = std::string(kMaxTopicBytes + 1, 't');
  EXPECT_EQ(a_->NotifyAfter(b_->key(), "m", {}, long_topic).Wait().code(), Code::kInvalidArgument);
  // Nothing to wait for: sent at once.
  ASSERT_TRUE(a_->NotifyAfter(b_->key(), "now", {}, {}).Wait().ok());
  EXPECT_EQ(NotesWithin(2s).size(), 1u);
  EXPECT_EQ(held().count(), 0u);
}

using TopicTest = HeldEnginesTest;

TEST_F(TopicTest, EachTopicReceivesOnlyItsOwn) {
  ASSERT_TRUE(a_->Notify(b_->key(), "app-1", "").ok());
  ASSERT_TRUE(a_->Notify(b_->key(), "kv-1", "ferry.kv").ok());
  ASSERT_TRUE(a_->Notify(b_->key(), "app-2", "").ok());
  ASSERT_TRUE(a_->Notify(b_->key(), "embed-1", "ferry.embed").ok());
  auto kv = b_->PopNotifications("ferry.kv");
  ASSERT_EQ(kv.size(), 1u);
  EXPECT_EQ(kv[0].message, "kv-1");
  EXPECT_EQ(kv[0].from, a_->key());
  EXPECT_EQ(kv[0].topic, "ferry.kv");
  auto app = b_->PopNotifications("");
  ASSERT_EQ(app.size(), 2u);
  EXPECT_EQ(app[0].message, "app-1");
  EXPECT_EQ(app[1].message, "app-2");
  EXPECT_EQ(app[0].topic, "");
  EXPECT_EQ(b_->PopNotifications("ferry.embed").size(), 1u);
  EXPECT_TRUE(b_->PopNotifications("ferry.kv").empty());
}

// max_notification_bytes bounds the message, not the frame around it.
TEST_F(TopicTest, AMessageOfExactlyTheLimitPassesOnTheLongestTopic) {
  const size_t max = a_->options().max_notification_bytes;
  const std::string topic(kMaxTopicBytes, 't');
  ASSERT_TRUE(a_->Notify(b_->key(), std::string(max, 'x'), topic).ok());
  EXPECT_EQ(a_->Notify(b_->key(), std::string(max + 1, 'x'), topic).code(), Code::kInvalidArgument);
  EXPECT_EQ(a_->Notify(b_->key(), "m", std::string(kMaxTopicBytes + 1, 't')).code(), Code::kInvalidArgument);
  // A default-topic message that begins like a frame is framed, and arrives as it was sent.
  const std::string tricky = std::string("\xFF\xA7\x01\x02", 4) + std::string(max - 4, 'y');
  ASSERT_TRUE(a_->Notify(b_->key(), tricky, "").ok());
  auto got = b_->PopNotifications(topic);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message.size(), max);
  auto app = b_->PopNotifications("");
  ASSERT_EQ(app.size(), 1u);
  EXPECT_EQ(app[0].message, tricky);
  EXPECT_EQ(b_->stats().dropped_notifications, 0u);
}

// A malformed frame from a peer is dropped and counted; the engine keeps receiving.
TEST_F(TopicTest, MalformedFramesAreRejected) {
  auto endpoint = a_->NotifyEndpointFor(b_->key());
  ASSERT_TRUE(endpoint.ok());
  EXPECT_EQ((*endpoint)->Notify(std::string("\xFF\xA7\x07\x00", 4)).code(), Code::kInvalidArgument);
  EXPECT_EQ((*endpoint)->Notify(std::string("\xFF\xA7\x01\x40", 4) + "short").code(), Code::kInvalidArgument);
  EXPECT_EQ(b_->stats().rejected_messages, 2u);
  EXPECT_TRUE(b_->PopNotifications("").empty());
  ASSERT_TRUE(a_->Notify(b_->key(), "fine", "t").ok());
  EXPECT_EQ(b_->PopNotifications("t").size(), 1u);
}

// The backlog bound counts every topic together.
TEST(TopicBacklog, TheBoundsHoldOverAllTopics) {
  EngineOptions o;
  o.transports = {"local"};
  o.max_pending_notifications = 3;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok());
  Engine& engine = **e;
  ASSERT_TRUE(engine.Notify(engine.key(), "1", "a").ok());
  ASSERT_TRUE(engine.Notify(engine.key(), "2", "b").ok());
  ASSERT_TRUE(engine.Notify(engine.key(), "3").ok());
  EXPECT_EQ(engine.Notify(engine.key(), "4", "c").code(), Code::kResourceExhausted);
  EXPECT_EQ(engine.stats().dropped_notifications, 1u);
  EXPECT_EQ(engine.PopNotifications("b").size(), 1u);
  ASSERT_TRUE(engine.Notify(engine.key(), "4", "c").ok());
  EXPECT_EQ(engine.PopNotifications("a").size(), 1u);
  EXPECT_EQ(engine.PopNotifications("c").size(), 1u);
  EXPECT_EQ(engine.PopNotifications().size(), 1u);
}

}  // namespace
}  // namespace ferry::internal
