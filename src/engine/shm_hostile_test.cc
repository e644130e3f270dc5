// The shm transport against peers that send what no engine would, through a raw client of an
// engine's socket: malformed messages, a scribbled notification ring, a peer that stops reading
// its acks. Each is rejected (and counted where it is malformed); the engine serves on.
// Notifications over the receiver's limits, forged descriptors and deregistered regions, which
// engines can send through the public API, are the cross-process suite's, once for every
// transport (process_hostile_test.cc).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "base/codec.h"
#include "base/unix_socket.h"
#include "testing/shm_peer.h"
#include "transport/shm/ring_format.h"
#include "transport/shm/wire.h"

namespace ferry {
namespace {

using namespace shm_testing;  // NOLINT: test helpers

// A raw client of an engine's shm socket, to send what no engine would.
class RawClient {
 public:
  explicit RawClient(const EngineDesc& engine) {
    const TransportData* t = engine.FindTransport("shm");
    EXPECT_NE(t, nullptr);
    auto reader = codec::Reader::Parse(t->data);
    EXPECT_TRUE(reader.ok());
    codec::ArrayReader root = reader->root();
    (void)root.Bytes("host", 1024);
    auto name = root.Bytes("socket", 100);
    EXPECT_TRUE(name.ok());
    auto fd = os::ConnectUnix(os::UnixAddress::Abstract(std::string(*name)), Deadline::At(Clock::time_point::min()));
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    fd_ = fd.ok() ? fd->release() : -1;
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  void Send(const std::string& bytes, std::vector<int> pass_fds = {}) {
    ASSERT_TRUE(os::SendMessage(fd_, bytes, pass_fds, Deadline::After(std::chrono::seconds(5))).ok());
  }
  void Send(const internal::shm::Header& h, std::string_view payload = {}) { Send(internal::shm::Encode(h, payload)); }
  // The next message, waiting up to 5 s.
  os::Received Next() {
    auto until = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < until) {
      auto r = os::ReceiveMessage(fd_, 1 << 16);
      if (r.ok()) return std::move(*r);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "no reply";
    return {};
  }
  int fd() const { return fd_; }
  // kUnavailable once the engine closed the connection, kInProgress while it is open; other
  // messages are consumed.
  Code Poll() {
    auto r = os::ReceiveMessage(fd_, 1 << 16);
    if (r.ok()) return Code::kOk;  // its descriptors close with it
    return r.status().code();
  }

 private:
  int fd_ = -1;
};

TEST(ShmHostile, MalformedMessagesAreRejectedAndCounted) {
  using namespace internal::shm;
  auto l = MakeLocal(4096, true);
  ASSERT_TRUE(l);
  std::vector<uint8_t> before(l->data(), l->data() + 4096);
  {
    RawClient raw(l->engine->Describe());
    Header open;
    open.type = MsgType::kOpen;
    open.region = static_cast<uint64_t>(l->desc.region);
    open.offset = l->desc.address;
    open.size = l->desc.size;
    auto access = UnpackAccess(l->desc.FindAccess("shm")->data);
    ASSERT_TRUE(access.ok());
    open.extra = access->second;  // the region's key, from its descriptor
    std::string good_open = Encode(open);
    raw.Send(good_open.substr(0, 10));  // 1. truncated header
    std::string b = good_open;
    b[0] = 9;  // 2. wire version
    raw.Send(b);
    raw.Send(good_open);  // 3. before hello
    Header hello;
    hello.type = MsgType::kHello;
    hello.size = 3;
    raw.Send(hello, "raw");
    auto ring = raw.Next();  // the answer to a hello: the notification ring
    auto r = Decode(ring.bytes.data(), ring.bytes.size());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->header.type, MsgType::kRing);
    EXPECT_EQ(r->header.code, 0);
    EXPECT_EQ(ring.fds.size(), 1u);
    ring.fds.clear();
    raw.Send(hello, "raw");  // 4. a second hello
    Header lying = open;
    lying.size = 8192;
    lying.token = 5;
    raw.Send(lying);  // 5. open with the wrong size: refused, counted
    auto reply = raw.Next();
    auto m = Decode(reply.bytes.data(), reply.bytes.size());
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->header.type, MsgType::kOpenReply);
    EXPECT_EQ(m->header.token, 5u);
    EXPECT_EQ(m->header.code, static_cast<uint8_t>(Code::kInvalidArgument));
    EXPECT_TRUE(reply.fds.empty());
    Header unknown = open;
    unknown.region = 12345;
    unknown.token = 6;
    raw.Send(unknown);  // not malformed: an unknown region is refused, not counted
    reply = raw.Next();
    m = Decode(reply.bytes.data(), reply.bytes.size());
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->header.code, static_cast<uint8_t>(Code::kFailedPrecondition));
    EXPECT_TRUE(reply.fds.empty());
    Header keyless = open;
    keyless.extra = open.extra ^ 1;
    keyless.token = 8;
    raw.Send(keyless);  // 11. the right region without its key: refused as unknown, counted
    reply = raw.Next();
    m = Decode(reply.bytes.data(), reply.bytes.size());
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->header.token, 8u);
    EXPECT_EQ(m->header.code, static_cast<uint8_t>(Code::kFailedPrecondition));
    EXPECT_TRUE(reply.fds.empty());
    Header short_hello = hello;
    short_hello.size = 10;
    raw.Send(Encode(short_hello) + "abc");  // 6. payload shorter than its size
    Header unmapped;
    unmapped.type = MsgType::kUnmapped;
    raw.Send(Encode(unmapped), {STDIN_FILENO});  // 7. a descriptor nobody asked for
    Header ack;
    ack.type = MsgType::kAck;
    raw.Send(ack);  // 8. an initiator's message sent to a target
    // 9. longer than any message (past what os::SendMessage sends, so sent raw)
    const std::string too_long = Encode(open) + std::string(70000, 'x');
    ASSERT_EQ(::send(raw.fd(), too_long.data(), too_long.size(), MSG_NOSIGNAL), static_cast<ssize_t>(too_long.size()));
    b = good_open;
    b[4] = 1;  // 10. reserved bytes
    raw.Send(b);
    // A well-formed open still works on the same connection: the file comes attached.
    open.token = 7;
    raw.Send(open);
    reply = raw.Next();
    m = Decode(reply.bytes.data(), reply.bytes.size());
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->header.token, 7u);
    EXPECT_EQ(m->header.code, 0);
    ASSERT_EQ(reply.fds.size(), 2u) << "the region's memory file and the revocation table";
    reply.fds.clear();
  }
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (l->engine->stats().rejected_messages < 11 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(l->engine->stats().rejected_messages, 11u);
  EXPECT_EQ(std::memcmp(l->data(), before.data(), 4096), 0);
  EXPECT_TRUE(l->engine->PopNotifications().empty());
  // The engine keeps serving well-formed peers.
  auto peer = StartInitiator(*l, 4096);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->Command("write 0 0 4096"), "DONE OK");
}

// The ring a child engine made for a raw client, mapped here so that the client can write
// what no engine would.
struct RawRing {
  std::byte* base = nullptr;
  size_t length = 0;
  uint64_t capacity = 0;
  uint64_t limit = 0;
  ~RawRing() {
    if (base != nullptr) munmap(base, length);
  }
  std::span<std::byte> records() { return {base + internal::shm::kRingControlBytes, capacity}; }
  void Publish(uint64_t head) {
    __atomic_store_n(reinterpret_cast<uint64_t*>(base + internal::shm::kRingHeadOffset), head, __ATOMIC_SEQ_CST);
  }
};

std::unique_ptr<RawRing> Hello(RawClient& raw, const std::string& key) {
  using namespace internal::shm;
  Header hello;
  hello.type = MsgType::kHello;
  hello.size = key.size();
  raw.Send(hello, key);
  auto reply = raw.Next();
  auto m = Decode(reply.bytes.data(), reply.bytes.size());
  EXPECT_TRUE(m.ok() && m->header.type == MsgType::kRing && reply.fds.size() == 1);
  if (!m.ok() || reply.fds.size() != 1) return nullptr;
  auto r = std::make_unique<RawRing>();
  r->capacity = m->header.size;
  r->limit = m->header.offset;
  r->length = kRingControlBytes + r->capacity;
  void* p = mmap(nullptr, r->length, PROT_READ | PROT_WRITE, MAP_SHARED, reply.fds[0].get(), 0);
  reply.fds[0].reset();
  EXPECT_NE(p, MAP_FAILED);
  if (p == MAP_FAILED) return nullptr;
  r->base = static_cast<std::byte*>(p);
  return r;
}

// "STATS <rejected> <dropped>" of the child once its rejected count reaches `want` (5 s at most).
std::string WaitRejected(PeerProcess& peer, uint64_t want) {
  std::string stats;
  auto until = Clock::now() + std::chrono::seconds(5);
  do {
    stats = peer.Command("stats");
    uint64_t rejected = 0;
    if (std::sscanf(stats.c_str(), "STATS %lu", &rejected) == 1 && rejected >= want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (Clock::now() < until);
  return stats;
}

TEST(ShmHostile, AScribbledRingIsRejectedAndTheEngineKeepsServing) {
  using namespace internal::shm;
  auto peer = PeerProcess::Start(4096, kSharedTarget);
  ASSERT_TRUE(peer);
  ASSERT_EQ(peer->Command("stats"), "STATS 0 0");
  // Each case: a good record, then a violation. `delivered`: whether the good one reaches the
  // inbox (not when the producer index itself is bad).
  enum class Bad { kFarAhead, kOverLimit, kPastHead, kUnknownFlags, kBehind, kHugeLength };
  struct Case {
    Bad bad;
    bool delivered;
  };
  const Case cases[] = {{Bad::kFarAhead, false}, {Bad::kOverLimit, true},   {Bad::kPastHead, true},
                        {Bad::kUnknownFlags, true}, {Bad::kBehind, true}, {Bad::kHugeLength, true}};
  uint64_t notes = 0;
  uint64_t rejected = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.bad));
    RawClient raw(peer->engine);
    auto ring = Hello(raw, "raw-" + std::to_string(rejected));
    ASSERT_TRUE(ring);
    ASSERT_GT(ring->limit, 0u);
    const std::string good = "good-" + std::to_string(rejected);
    PutRecord(ring->records(), 0, good, 0, false);
    uint64_t head = RecordSpan(good.size());
    auto header = [&](uint32_t size, uint32_t flags) {
      uint8_t h[16] = {};
      std::memcpy(h, &size, 4);
      std::memcpy(h + 4, &flags, 4);
      std::memcpy(ring->records().data() + head, h, 16);
    };
    switch (c.bad) {
      case Bad::kFarAhead:
        head = ring->capacity + 8;
        break;
      case Bad::kOverLimit:
        header(static_cast<uint32_t>(ring->limit + 1), 0);
        head += RecordSpan(ring->limit + 1);
        break;
      case Bad::kPastHead:
        header(100, 0);
        head += 24;
        break;
      case Bad::kUnknownFlags:
        header(8, 0x80);
        head += 24;
        break;
      case Bad::kHugeLength:
        header(0xffffffffu, 0);
        head += 16;
        break;
      case Bad::kBehind:
        // Taken first; then the producer index moves back behind the consumer's.
        ring->Publish(head);
        (void)peer->WaitNotes("NOTES " + std::to_string(notes + 1) + " " + good);
        head = 8;
        break;
    }
    ring->Publish(head);
    Header wake;
    wake.type = MsgType::kWake;
    raw.Send(wake);
    ++rejected;
    EXPECT_EQ(WaitRejected(*peer, rejected), "STATS " + std::to_string(rejected) + " 0");
    if (c.delivered) ++notes;
    std::string want = "NOTES " + std::to_string(notes) + " ";
    EXPECT_EQ(peer->Command("notes").rfind(want, 0), 0u) << want;
    // The child dropped the connection: the socket is closed at its end.
    auto until = Clock::now() + std::chrono::seconds(5);
    Code closed = Code::kInProgress;
    while (closed == Code::kInProgress && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      closed = raw.Poll();
    }
    EXPECT_EQ(closed, Code::kUnavailable);
  }
  // The child keeps serving well-behaved peers: notifications, with and without data.
  auto l = MakeLocal(4096, true);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(peer->engine).ok());
  ASSERT_TRUE(l->engine->Notify(peer->engine.key, "still-serving").ok());
  auto s = l->engine->OpenSession(l->desc, peer->memory);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TransferOptions with_note;
  with_note.notification = "batch-after";
  ASSERT_TRUE(s->Write(0, 0, 4096, with_note).Wait().ok());
  EXPECT_EQ(peer->Command("notes"), "NOTES " + std::to_string(notes + 2) + " batch-after");
  EXPECT_EQ(peer->Command(HashCmd(0, 4096)), HashOf(l->data(), 4096));
  EXPECT_EQ(peer->Command("stats"), "STATS " + std::to_string(rejected) + " 0");
}

// A peer that publishes many acked notifications and then stops reading its socket (a stopped
// process): the application thread that drains the ring (PopNotifications) sends the acks only
// where they go at once and hands the rest to the I/O thread, so it never waits for the peer
// (before, it waited up to the 1 s send timeout). Every ack still arrives once the peer reads.
TEST(ShmHostile, APeerThatStopsReadingDoesNotHoldThePollingThread) {
  using namespace internal::shm;
  auto l = MakeLocal(4096, true);
  ASSERT_TRUE(l);
  RawClient raw(l->engine->Describe());
  auto ring = Hello(raw, "stopped-peer");
  ASSERT_TRUE(ring);
  // Far more acks than a Unix socket holds (a few hundred small messages).
  const uint64_t n = std::min<uint64_t>(3000, ring->capacity / RecordSpan(8) - 1);
  ASSERT_GT(n, 1000u);
  uint64_t head = 0;
  for (uint64_t i = 1; i <= n; ++i) {
    const std::string m = "n" + std::to_string(i);
    PutRecord(ring->records(), head, m, i, true);
    head += RecordSpan(m.size());
  }
  ring->Publish(head);  // no kWake: the application thread, polling, finds them first
  size_t got = 0;
  Clock::duration longest{};
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (got < n && Clock::now() < until) {
    const auto start = Clock::now();
    got += l->engine->PopNotifications().size();
    longest = std::max(longest, Clock::now() - start);
  }
  EXPECT_EQ(got, n);
  EXPECT_LT(longest, std::chrono::milliseconds(300)) << "PopNotifications waited for a peer that does not read";
  // The peer reads again: every ack arrives, each token once.
  std::vector<bool> seen(n + 1, false);
  uint64_t acks = 0;
  const auto read_until = Clock::now() + std::chrono::seconds(5);
  while (acks < n && Clock::now() < read_until) {
    auto r = os::ReceiveMessage(raw.fd(), 1 << 16);
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), Code::kInProgress) << r.status().ToString();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    auto h = DecodeHeader(r->bytes.data(), r->bytes.size());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_EQ(h->type, MsgType::kAck);
    ASSERT_GE(h->token, 1u);
    ASSERT_LE(h->token, n);
    EXPECT_FALSE(seen[h->token]) << "ack " << h->token << " twice";
    seen[h->token] = true;
    EXPECT_EQ(h->code, 0);
    ++acks;
  }
  EXPECT_EQ(acks, n);
  EXPECT_EQ(l->engine->stats().rejected_messages, 0u);
}

}  // namespace
}  // namespace ferry
