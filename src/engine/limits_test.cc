// Every bound on what a peer can make an engine spend (docs/limits.md lists them): the
// notification backlog per peer, the ucx door's connections and pending handshakes, the shm
// listener, the metrics endpoint. Each case floods one resource past its limit and checks that
// the flood is refused at the limit with the documented error and counter, that the process
// starts no thread for it and its resident memory stays bounded, and that a good peer is
// served afterwards. Each case takes a few seconds at most.
//
// Bounds that other suites already show fully are not repeated here: notifications over
// max_notification_bytes and the global backlog (process_hostile_test.cc, over every
// transport; after_topic_test.cc over topics), junk and idle handshakes at the ucx door
// (ucx_hostile_test.cc), a stalled metrics client (metrics_http_test.cc), the wire decoders'
// length checks (each transport's *wire_test.cc and fuzz/).
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "base/codec.h"
#include "base/endian.h"
#include "base/unix_socket.h"
#include "ferry/engine.h"
#include "ferry/metrics.h"
#include "ferry/shared_memory.h"
#include "testing/loopback.h"
#include "testing/resources.h"
#include "testing/shm_socket.h"
#include "transport/inbox.h"
#include "transport/notify_frame.h"
#include "transport/ucx/door.h"
#include "transport/ucx/door_wire.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using internal::Inbox;
using testing::Eventually;
using testing::ResidentBytes;
using testing::ThreadCount;
using testing::ShmSocketName;

constexpr uint64_t kBytes = 4096;
// Resident memory a flood may add (allocator caches, socket bookkeeping): far below what one
// unbounded buffer per connection or a trusted length field would take.
constexpr uint64_t kRssSlack = (uint64_t{32} << 20) + testing::kSanitizerRssSlack;

// An engine with one shareable host buffer registered (shm reaches only those).
struct Node {
  HostBuffer buf;
  std::unique_ptr<Engine> engine;
  MemoryDesc region;
};

std::unique_ptr<Node> MakeNode(const std::string& key, std::vector<std::string> transports, EngineOptions o = {}) {
  auto n = std::make_unique<Node>();
  o.key = key;
  o.transports = std::move(transports);
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  n->engine = std::move(e).value();
  auto b = AllocateSharedHost(kBytes);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return nullptr;
  n->buf = std::move(b).value();
  std::memset(n->buf.data(), 7, kBytes);
  auto d = n->engine->RegisterMemory(n->buf.data(), kBytes);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return nullptr;
  n->region = *d;
  return n;
}

// `from` writes its buffer into `to`'s region over a new connection.
Status WriteInto(Node& from, Node& to) {
  auto desc = EngineDesc::Unpack(to.engine->Describe().Pack());
  if (!desc.ok()) return desc.status();
  FERRY_RETURN_IF_ERROR(from.engine->AddPeer(*desc));
  FERRY_ASSIGN_OR_RETURN(Session s, from.engine->OpenSession(from.region, to.region));
  return s.Write(0, 0, kBytes).Wait();
}

// A peer that never took part in the flood still gets in: a fresh engine writes into `to`.
void ExpectServesANewPeer(Node& to, const std::string& transport) {
  static int n = 0;
  auto good = MakeNode("good-" + std::to_string(n++), {transport});
  ASSERT_TRUE(good);
  Status s = WriteInto(*good, to);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

void AddPeers(Node& a, Node& b) {
  ASSERT_TRUE(a.engine->AddPeer(*EngineDesc::Unpack(b.engine->Describe().Pack())).ok());
  ASSERT_TRUE(b.engine->AddPeer(*EngineDesc::Unpack(a.engine->Describe().Pack())).ok());
}

bool ClosedWithin(int fd, std::chrono::milliseconds d) {
  pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(d.count())) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

uint16_t UcxPort(const Engine& e) {
  const std::string address = e.Describe().addresses.front();
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

// ---- The notification backlog, per peer --------------------------------------------------------

Status PushFrom(Inbox& inbox, const std::string& from, const std::string& message) {
  return inbox.Push(Notification{from, message});
}

// One peer holds at most its share of the backlog; past it its notifications are refused as the
// full backlog refuses them (kResourceExhausted, counted), while other peers still get in. Its
// share comes back as the application takes its notifications.
TEST(InboxLimits, OnePeerHoldsAtMostItsShare) {
  Inbox inbox(/*max_pending=*/16, /*max_bytes=*/64, /*max_pending_bytes=*/SIZE_MAX, /*max_pending_per_peer=*/4);
  ASSERT_EQ(inbox.max_pending_per_peer(), 4u);
  int taken = 0;
  for (int i = 0; i < 100; ++i) {
    Status s = PushFrom(inbox, "flooder", "f" + std::to_string(i));
    if (s.ok()) {
      ++taken;
    } else {
      EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
      EXPECT_NE(s.message().find("per peer"), std::string_view::npos) << s.ToString();
    }
  }
  EXPECT_EQ(taken, 4);
  EXPECT_EQ(inbox.dropped(), 96u);
  EXPECT_EQ(inbox.dropped_per_peer(), 96u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(PushFrom(inbox, "good", "g" + std::to_string(i)).ok());
  EXPECT_EQ(PushFrom(inbox, "good", "g4").code(), Code::kResourceExhausted);
  std::vector<Notification> got = inbox.PopAll();
  ASSERT_EQ(got.size(), 8u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i].from, "flooder");
    EXPECT_EQ(got[i].message, "f" + std::to_string(i)) << "the first ones are kept, in order";
    EXPECT_EQ(got[4 + i].from, "good");
  }
  EXPECT_TRUE(PushFrom(inbox, "flooder", "again").ok()) << "taking its notifications frees its share";
  // The global bound still holds over every peer: 16 peers' shares are 64, the backlog 16.
  int all = 1;
  for (int p = 0; p < 16; ++p)
    for (int i = 0; i < 4; ++i) all += PushFrom(inbox, "p" + std::to_string(p), "x").ok();
  EXPECT_EQ(all, 16);
  EXPECT_EQ(inbox.PopAll().size(), 16u);
}

// Refusals by the byte bound leave no trace of the peer behind, and notifications of every topic
// count towards their peer's share.
TEST(InboxLimits, TheShareCountsEveryTopicAndRefusalsLeaveNoState) {
  Inbox inbox(16, 64, /*max_pending_bytes=*/100, /*max_pending_per_peer=*/3);
  ASSERT_TRUE(PushFrom(inbox, "a", internal::EncodeNotifyFrame("t1", "x")).ok());
  ASSERT_TRUE(PushFrom(inbox, "a", internal::EncodeNotifyFrame("t2", "x")).ok());
  ASSERT_TRUE(PushFrom(inbox, "a", "x").ok());
  EXPECT_EQ(PushFrom(inbox, "a", internal::EncodeNotifyFrame("t3", "x")).code(), Code::kResourceExhausted);
  ASSERT_TRUE(PushFrom(inbox, "b", std::string(64, 'b')).ok());
  // 3 + 64 of 100 bytes held: 40 more from c do not fit (refused by bytes, not by c's share).
  EXPECT_EQ(PushFrom(inbox, "c", std::string(40, 'c')).code(), Code::kResourceExhausted);
  EXPECT_EQ(inbox.dropped_per_peer(), 1u);
  EXPECT_EQ(inbox.dropped(), 2u);
  EXPECT_EQ(inbox.PopAll("t1").size(), 1u);
  EXPECT_EQ(inbox.PopAll("t2").size(), 1u);
  EXPECT_EQ(inbox.PopAll("").size(), 2u);
  // c's refused notification left it no share in use: three of its own fit now.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(PushFrom(inbox, "c", "c").ok());
  EXPECT_EQ(PushFrom(inbox, "c", "c").code(), Code::kResourceExhausted);
}

// The default share: a quarter of the backlog, not below 64 (all of a smaller backlog, which one
// peer's burst may fill), never more than the backlog.
TEST(InboxLimits, TheDefaultShareIsAQuarterOfTheBacklog) {
  EXPECT_EQ(EngineOptions{}.max_pending_notifications_per_peer, 0u) << "0 = derived from the backlog";
  EXPECT_EQ(Inbox(EngineOptions{}.max_pending_notifications, 64).max_pending_per_peer(),
            EngineOptions{}.max_pending_notifications / 4);
  EXPECT_EQ(Inbox(1 << 16, 64).max_pending_per_peer(), 1u << 14);
  EXPECT_EQ(Inbox(1024, 64).max_pending_per_peer(), 256u);
  EXPECT_EQ(Inbox(100, 64).max_pending_per_peer(), 64u);
  EXPECT_EQ(Inbox(8, 64).max_pending_per_peer(), 8u);
  EXPECT_EQ(Inbox(1, 64).max_pending_per_peer(), 1u);
  EXPECT_EQ(Inbox(16, 64, SIZE_MAX, 1000).max_pending_per_peer(), 16u);
}

class NotificationLimits : public ::testing::TestWithParam<std::string> {};

// An engine's backlog of 1024 notifications (a share of 256 per peer by default): a peer that
// floods it with 1500 has 256 taken and the rest dropped and counted, and another peer's
// notifications still arrive. Without the share, the flooder would have filled all 1024.
TEST_P(NotificationLimits, AFloodingPeerDoesNotStarveAnother) {
  const std::string transport = GetParam();
  EngineOptions o;
  o.max_pending_notifications = 1024;
  o.max_notification_bytes = 256;
  auto target = MakeNode("target", {transport}, o);
  auto flooder = MakeNode("flooder", {transport});
  auto good = MakeNode("good-sender", {transport});
  ASSERT_TRUE(target && flooder && good);
  AddPeers(*target, *flooder);
  AddPeers(*target, *good);
  Engine& t = *target->engine;
  // Connections come up with the first notification of each: the flood is measured after.
  ASSERT_TRUE(flooder->engine->Notify("target", "hello").ok());
  ASSERT_TRUE(good->engine->Notify("target", "hello").ok());
  std::vector<Notification> got;
  ASSERT_TRUE(Eventually([&] {
    for (auto& n : t.PopNotifications()) got.push_back(std::move(n));
    return got.size() == 2;
  }));
  got.clear();
  const int threads = ThreadCount();
  const uint64_t rss = ResidentBytes();

  constexpr int kFlood = 1500, kShare = 256;
  int refused_here = 0;
  for (int i = 0; i < kFlood; ++i) {
    Status s = flooder->engine->Notify("target", "flood " + std::to_string(i) + std::string(100, '.'));
    if (!s.ok()) {
      // Within a process the refusal is reported to the sender too; across processes it is
      // one-way and counted at the receiver only.
      EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
      ++refused_here;
    }
  }
  // Between processes of a host (shm) a notification the receiver's ring has no room for is
  // refused at the sender (kResourceExhausted) and not counted at the receiver: every one of
  // the flood is either taken (its share), dropped and counted at the receiver, or that.
  const uint64_t refused_by_ring = transport == "shm" ? refused_here : 0;
  const uint64_t past_share = kFlood - kShare;
  ASSERT_TRUE(Eventually([&] { return t.stats().dropped_notifications + refused_by_ring >= past_share; }))
      << t.stats().dropped_notifications << " dropped, " << refused_here << " refused at the sender";
  const uint64_t dropped = t.stats().dropped_notifications;
  EXPECT_EQ(dropped + refused_by_ring, past_share);
  if (transport == "local") {
    EXPECT_EQ(refused_here, kFlood - kShare);
  }
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(good->engine->Notify("target", "good " + std::to_string(i)).ok());
  size_t from_good = 0, from_flooder = 0;
  ASSERT_TRUE(Eventually([&] {
    for (auto& n : t.PopNotifications()) (n.from == "good-sender" ? from_good : from_flooder)++;
    return from_good == 10 && from_flooder == kShare;
  })) << from_good << " from the good peer, " << from_flooder << " from the flooder";
  EXPECT_EQ(t.stats().dropped_notifications, dropped) << "none of the good peer's notifications was dropped";
  EXPECT_EQ(t.stats().rejected_messages, 0u) << "refused at the limit, not malformed";
  EXPECT_LE(ThreadCount(), threads);
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
  // Once taken, the flooder's share is free again.
  ASSERT_TRUE(flooder->engine->Notify("target", "after").ok());
  ASSERT_TRUE(Eventually([&] { return t.PopNotifications().size() == 1; }));
}

INSTANTIATE_TEST_SUITE_P(Transports, NotificationLimits, ::testing::Values("local", "ucx", "shm"),
                         [](const auto& info) { return info.param; });

// ---- The ucx door ------------------------------------------------------------------------------

// Past ucx.max_connections a handshake is answered kResourceExhausted naming the option, before
// the peer's worker address is even looked at; the refusals start no thread; when a peer leaves,
// its place is free for the next.
TEST(UcxDoorLimits, ConnectionsPastMaxConnectionsAreRefused) {
  EngineOptions o;
  o.ucx.max_connections = 2;
  auto target = MakeNode("target", {"ucx"}, o);
  auto p1 = MakeNode("peer-1", {"ucx"});
  auto p2 = MakeNode("peer-2", {"ucx"});
  ASSERT_TRUE(target && p1 && p2);
  ASSERT_TRUE(WriteInto(*p1, *target).ok());
  ASSERT_TRUE(WriteInto(*p2, *target).ok());
  const std::string address = target->engine->Describe().addresses.front();
  const int threads = ThreadCount();
  const uint64_t rss = ResidentBytes();
  for (int i = 0; i < 50; ++i) {
    internal::ucx::Hello hello{"mallory-" + std::to_string(i), "target", 1, std::string(300, 'x'), {}};
    auto d = internal::ucx::Dial(address, hello, Deadline::After(2s));
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), Code::kResourceExhausted) << d.status().ToString();
    EXPECT_NE(d.status().message().find("ucx.max_connections"), std::string_view::npos) << d.status().ToString();
  }
  EXPECT_LE(ThreadCount(), threads);
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
  // A real engine past the limit fails to connect, with the target's reason.
  auto p3 = MakeNode("peer-3", {"ucx"});
  ASSERT_TRUE(p3);
  Status third = WriteInto(*p3, *target);
  EXPECT_FALSE(third.ok());
  EXPECT_NE(third.message().find("max_connections"), std::string_view::npos) << third.ToString();
  // The first two are still served.
  auto s1 = p1->engine->OpenSession(p1->region, target->region);
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  EXPECT_TRUE(s1->Write(0, 0, kBytes).Wait().ok());
  // A peer leaves: the next one gets its place (the door sees the connection close).
  p1.reset();
  Status fourth;
  int tries = 0;
  ASSERT_TRUE(Eventually([&] {
    auto next = MakeNode("peer-4-" + std::to_string(tries++), {"ucx"});
    fourth = next ? WriteInto(*next, *target) : Status(Code::kInternal, "no engine");
    return fourth.ok();
  }, 5s)) << fourth.ToString();
}

// A door frame prefix: [u32 length][magic][u16 version].
std::string DoorPrefix(uint32_t length) {
  std::string p(internal::ucx::kDoorPrefixBytes, '\0');
  StoreLe32(p.data(), length);
  std::memcpy(p.data() + 4, internal::ucx::kDoorMagic, sizeof(internal::ucx::kDoorMagic));
  StoreLe16(p.data() + 4 + sizeof(internal::ucx::kDoorMagic), internal::ucx::kDoorVersion);
  return p;
}

// Hundreds of connections that never finish a handshake, and handshakes whose length field
// claims up to 4 GiB, start no thread and allocate nothing of that size: those past the length
// limit are closed at once, the idle ones within the handshake timeout, and a real peer gets in
// meanwhile.
TEST(UcxDoorLimits, AFloodOfIdleAndHugeHandshakesStartsNoThreadAndAllocatesNothing) {
  EngineOptions o;
  o.ucx.max_pending_handshakes = 16;
  o.ucx.handshake_timeout = 500ms;
  auto target = MakeNode("target", {"ucx"}, o);
  ASSERT_TRUE(target);
  ExpectServesANewPeer(*target, "ucx");  // the door's threads are up: the baseline follows
  const uint16_t port = UcxPort(*target->engine);
  const int threads = ThreadCount();
  const uint64_t rss = ResidentBytes();
  std::vector<int> idle, huge;
  for (int i = 0; i < 200; ++i) {
    auto [fd, rc] = testing::DialLoopback(port);
    if (rc == 0) idle.push_back(fd);
    else close(fd);
  }
  ASSERT_GT(idle.size(), 150u);
  for (uint32_t length : {uint32_t{0xffffffff}, uint32_t{1} << 31, uint32_t(internal::ucx::kMaxDoorFrame + 1)}) {
    for (int i = 0; i < 30; ++i) {
      auto [fd, rc] = testing::DialLoopback(port);
      ASSERT_EQ(rc, 0);
      const std::string prefix = DoorPrefix(length);
      ASSERT_EQ(send(fd, prefix.data(), prefix.size(), MSG_NOSIGNAL), static_cast<ssize_t>(prefix.size()));
      huge.push_back(fd);
    }
  }
  EXPECT_LE(ThreadCount(), threads) << "a thread per connection";
  ExpectServesANewPeer(*target, "ucx");
  int closed = 0;
  for (int fd : huge) {
    closed += ClosedWithin(fd, 2000ms);
    close(fd);
  }
  EXPECT_EQ(closed, static_cast<int>(huge.size())) << "a handshake past kMaxDoorFrame was kept";
  closed = 0;
  for (int fd : idle) {
    closed += ClosedWithin(fd, 3000ms);
    close(fd);
  }
  EXPECT_EQ(closed, static_cast<int>(idle.size())) << "idle connections were kept past the handshake timeout";
  EXPECT_LE(ThreadCount(), threads);
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
}

// ---- The shm listener --------------------------------------------------------------------------

// Connections to the shm socket (same user or ShmOptions::allowed_uids, which SO_PEERCRED checks) are served by the
// transport's one I/O thread: a flood of them, idle or sending datagrams far over the largest
// message, starts no thread and keeps no buffer of the claimed size; the oversized ones are
// rejected and counted, and a real peer gets in meanwhile.
TEST(ShmLimits, AFloodOfConnectionsAndOversizedMessagesStartsNoThread) {
  auto target = MakeNode("target", {"shm"});
  ASSERT_TRUE(target);
  ExpectServesANewPeer(*target, "shm");
  const std::string name = ShmSocketName(target->engine->Describe());
  ASSERT_FALSE(name.empty());
  const int threads = ThreadCount();
  const uint64_t rss = ResidentBytes();
  const uint64_t rejected = target->engine->stats().rejected_messages;
  std::vector<os::UniqueFd> conns;
  for (int i = 0; i < 200; ++i) {
    auto fd = os::ConnectUnix(os::UnixAddress::Abstract(name), Deadline::After(1s));
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    conns.push_back(std::move(fd).value());
  }
  const std::string big(2 * os::kMaxMessageBytes, 'z');
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(send(conns[i].get(), big.data(), big.size(), MSG_NOSIGNAL), static_cast<ssize_t>(big.size())) << errno;
  ASSERT_TRUE(Eventually([&] { return target->engine->stats().rejected_messages >= rejected + 20; }))
      << target->engine->stats().rejected_messages - rejected;
  EXPECT_LE(ThreadCount(), threads) << "a thread per connection";
  ExpectServesANewPeer(*target, "shm");
  conns.clear();
  EXPECT_LE(ThreadCount(), threads);
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
}

// ---- The metrics endpoint ----------------------------------------------------------------------

// The endpoint serves one request at a time on one thread (loopback only; a request head is at
// most kMaxRequestBytes and kRequestTimeout, metrics_http_test.cc): a flood of connections that
// send junk or nothing and hang up starts no thread, and the next scrape is answered.
TEST(MetricsLimits, AFloodOfConnectionsStartsNoThread) {
  EngineOptions o;
  o.metrics_port = -1;
  auto node = MakeNode("metrics", {"local"}, o);
  ASSERT_TRUE(node);
  const uint16_t port = static_cast<uint16_t>(node->engine->MetricsPort());
  const int threads = ThreadCount();
  const uint64_t rss = ResidentBytes();
  int connected = 0;
  // Non-blocking: the endpoint's backlog is short, and a connect past it would wait for SYN
  // retries; those are closed unsent.
  for (int i = 0; i < 300; ++i) {
    auto [fd, rc] = testing::DialLoopback(port, SOCK_NONBLOCK);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      int err = 1;
      socklen_t len = sizeof(err);
      if (poll(&p, 1, 100) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) rc = 0;
    }
    connected += rc == 0;
    if (rc == 0 && i % 2 == 0) {
      const std::string junk = i % 4 == 0 ? std::string(9000, 'A') : std::string("\x01\x02\r\n\r\n");
      (void)!send(fd, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close(fd);
    if (i % 50 == 0) {
      EXPECT_LE(ThreadCount(), threads);
    }
  }
  EXPECT_GE(connected, 16) << "the flood never reached the endpoint";
  std::string reply;
  ASSERT_TRUE(Eventually([&] {
    auto [fd, rc] = testing::DialLoopback(port);
    reply.clear();
    if (rc == 0) {
      const std::string get = "GET /metrics HTTP/1.0\r\n\r\n";
      (void)!send(fd, get.data(), get.size(), MSG_NOSIGNAL);
      char buf[4096];
      pollfd p = {fd, POLLIN, 0};
      while (poll(&p, 1, 2000) == 1) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        reply.append(buf, static_cast<size_t>(n));
      }
    }
    close(fd);
    return reply.rfind("HTTP/1.0 200 OK", 0) == 0;
  }, 10s)) << reply;
  EXPECT_LE(ThreadCount(), threads);
  EXPECT_LT(ResidentBytes(), rss + kRssSlack);
}

// Past ShmOptions::max_connections a connection is closed at accept and counted
// (EngineStats::connections_refused, ferry_connections_refused_total): a flood holds no more
// than the limit of descriptors and starts no thread, and once the connections served go, a
// good peer is served again. The limit is checked at Engine::Create.
TEST(ShmLimits, ConnectionsPastMaxConnectionsAreRefusedAndCounted) {
  EngineOptions bad;
  bad.shm.max_connections = 0;
  EXPECT_EQ(Engine::Create(bad).status().code(), Code::kInvalidArgument);
  bad.shm.max_connections = kMaxShmConnections + 1;
  EXPECT_EQ(Engine::Create(bad).status().code(), Code::kInvalidArgument);

  constexpr size_t kLimit = 4;
  constexpr int kFlood = 40;
  EngineOptions o;
  o.shm.max_connections = kLimit;
  auto target = MakeNode("capped", {"shm"}, o);
  ASSERT_TRUE(target);
  const std::string name = ShmSocketName(target->engine->Describe());
  ASSERT_FALSE(name.empty());
  const int threads = ThreadCount();
  auto descriptors = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const int fds = descriptors();
  std::vector<os::UniqueFd> served, refused;
  for (size_t i = 0; i < kLimit; ++i) {
    auto fd = os::ConnectUnix(os::UnixAddress::Abstract(name), Deadline::After(1s));
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    served.push_back(std::move(fd).value());
  }
  // Accepted in order: the first kLimit are served before the flood is looked at.
  ASSERT_FALSE(ClosedWithin(served.back().get(), 200ms)) << "a connection within the limit was closed";
  EXPECT_EQ(target->engine->stats().connections_refused, 0u);
  for (int i = 0; i < kFlood; ++i) {
    auto fd = os::ConnectUnix(os::UnixAddress::Abstract(name), Deadline::After(1s));
    if (fd.ok()) refused.push_back(std::move(fd).value());  // a full backlog may refuse it at connect
  }
  ASSERT_TRUE(Eventually([&] { return target->engine->stats().connections_refused >= refused.size(); }))
      << target->engine->stats().connections_refused << " of " << refused.size();
  EXPECT_GT(refused.size(), 0u);
  for (auto& fd : refused) EXPECT_TRUE(ClosedWithin(fd.get(), 1s)) << "a connection past the limit was served";
  for (auto& fd : served) EXPECT_FALSE(ClosedWithin(fd.get(), 0ms));
  // Our ends of every connection, and the engine's ends of the served ones only.
  EXPECT_EQ(descriptors(), fds + static_cast<int>(kLimit + refused.size() + kLimit));
  EXPECT_LE(ThreadCount(), threads) << "a thread per connection";
  const uint64_t count = target->engine->stats().connections_refused;
  EXPECT_EQ(count, refused.size());
  const std::string text = RenderPrometheus(target->engine->Metrics());
  EXPECT_NE(text.find("ferry_connections_refused_total{engine=\"capped\"} " + std::to_string(count)),
            std::string::npos)
      << text;
  refused.clear();
  served.clear();
  // The served connections are dropped as their peers hang up; then a good peer gets in.
  ASSERT_TRUE(Eventually([&] { return descriptors() <= fds; })) << descriptors() << " vs " << fds;
  ExpectServesANewPeer(*target, "shm");
  EXPECT_EQ(target->engine->stats().connections_refused, count);
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// EngineOptions::max_pending_notifications_per_peer reaches the engine's backlog: a peer gets
// exactly that many undelivered notifications taken; a value over the backlog is refused.
TEST(NotificationShareOption, TheOptionSetsEachPeersShare) {
  EngineOptions bad;
  bad.transports = {"local"};
  bad.max_pending_notifications = 100;
  bad.max_pending_notifications_per_peer = 101;
  auto refused = Engine::Create(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("max_pending_notifications_per_peer"), std::string::npos);

  EngineOptions o;
  o.transports = {"local"};
  o.max_pending_notifications = 100;
  o.max_pending_notifications_per_peer = 3;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  int taken = 0;
  for (int i = 0; i < 10; ++i) taken += e.Notify(e.key(), "n" + std::to_string(i)).ok() ? 1 : 0;
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(e.PopNotifications().size(), 3u);
  EXPECT_EQ(e.stats().dropped_notifications, 7u);
}

}  // namespace
}  // namespace ferry
