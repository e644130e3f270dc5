// Multi-process tests of the shm transport against ferry_test_peer children: transfers with
// verification, the fallback to ucx for memory that is not shareable, peers (targets and
// initiators) that die or stop, revocation on deregistration, and malformed socket messages.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/codec.h"
#include "engine/peer_process.h"
#include "engine/test_util.h"
#include "ferry/shared_memory.h"
#include "transport/shm/ring_format.h"
#include "transport/shm/socket.h"
#include "transport/shm/wire.h"

namespace ferry {
namespace {

using testing::Fnv;
using testing::PeerProcess;
using Clock = std::chrono::steady_clock;

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// This process's side: an engine with shm and ucx and one registered buffer.
struct Local {
  HostBuffer shared;
  std::vector<uint8_t> heap;
  std::unique_ptr<Engine> engine;
  MemoryDesc desc;
  uint8_t* data() { return shared ? reinterpret_cast<uint8_t*>(shared.data()) : heap.data(); }
};

std::unique_ptr<Local> MakeLocal(size_t bytes, bool shared, EngineOptions options = {}) {
  auto l = std::make_unique<Local>();
  if (shared) {
    auto b = AllocateSharedHost(bytes);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    l->shared = std::move(b).value();
  } else {
    l->heap.assign(bytes, 0);
  }
  auto bytes_in = testing::RandomBytes(bytes, 42);
  std::memcpy(l->data(), bytes_in.data(), bytes);
  if (options.transports.empty()) options.transports = {"shm", "ucx"};
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  l->engine = std::move(e).value();
  auto d = l->engine->RegisterMemory(l->data(), bytes);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return nullptr;
  l->desc = *d;
  return l;
}

const std::vector<std::string> kSharedTarget = {"--transports", "shm,ucx", "--alloc", "shared"};
const std::vector<std::string> kHeapTarget = {"--transports", "shm,ucx", "--alloc", "heap"};

std::string HashCmd(uint64_t off, uint64_t size) { return "hash " + std::to_string(off) + " " + std::to_string(size); }
std::string HashOf(const uint8_t* p, uint64_t size) { return "HASH " + std::to_string(Fnv(p, size)); }

// The child maps this process's region and writes into it.
std::unique_ptr<PeerProcess> StartInitiator(Local& l, uint64_t bytes) {
  auto peer = PeerProcess::Start(bytes, kSharedTarget);
  EXPECT_TRUE(peer);
  if (!peer) return nullptr;
  EXPECT_EQ(peer->Command("peer " + Hex(l.engine->Describe().Pack())), "OK");
  EXPECT_EQ(peer->Command("open " + Hex(l.desc.Pack())), "SESSION shm");
  return peer;
}

TEST(ShmProcess, WritesReadsAndNotifiesAcrossProcesses) {
  const size_t kBytes = 16 << 20;
  auto peer = PeerProcess::Start(kBytes, kSharedTarget);
  ASSERT_TRUE(peer);
  ASSERT_NE(peer->memory.FindAccess("shm"), nullptr);
  auto l = MakeLocal(kBytes, /*shared=*/false);  // only the target's memory must be shareable
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(peer->engine).ok());
  auto s = l->engine->OpenSession(l->desc, peer->memory);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->path().transport, "shm");

  const size_t kBlock = 32 << 10, kBlocks = kBytes / kBlock;
  std::vector<TransferOp> ops;
  for (size_t b = 0; b < kBlocks; b += 2) ops.push_back({b * kBlock, (kBlocks - 1 - b) * kBlock, kBlock});
  TransferOptions options;
  options.notification = "req-7 done";
  Transfer t = s->WriteBatch(ops, options);
  ASSERT_TRUE(t.Wait().ok()) << t.status().ToString();
  EXPECT_EQ(t.path().transport, "shm");
  for (size_t i = 0; i < ops.size(); i += 97)
    EXPECT_EQ(peer->Command(HashCmd(ops[i].remote_offset, kBlock)), HashOf(l->data() + ops[i].local_offset, kBlock));
  EXPECT_EQ(peer->Command("notes"), "NOTES 1 req-7 done");

  // Large enough to be split over the copy threads.
  ASSERT_EQ(peer->Command("fill 9"), "OK");
  ASSERT_TRUE(s->Read(0, 0, kBytes).Wait().ok());
  EXPECT_EQ(peer->Command(HashCmd(0, kBytes)), HashOf(l->data(), kBytes));
  ASSERT_TRUE(l->engine->Notify(peer->engine.key, "direct").ok());
  EXPECT_EQ(peer->Command("notes"), "NOTES 2 direct");

  EXPECT_EQ(s->Write(0, kBytes - 1, 2).Wait().code(), Code::kOutOfRange);
  MemoryDesc lying = peer->memory;
  lying.size *= 2;
  EngineOptions only_shm;
  only_shm.transports = {"shm"};
  auto m = MakeLocal(4096, true, only_shm);
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->engine->AddPeer(peer->engine).ok());
  EXPECT_EQ(m->engine->OpenSession(m->desc, lying).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(m->engine->OpenSession(m->desc, peer->memory).ok());
}

TEST(ShmProcess, MemoryThatIsNotShareableGoesOverUcx) {
  auto heap_peer = PeerProcess::Start(1 << 20, kHeapTarget);
  auto shared_peer = PeerProcess::Start(1 << 20, kSharedTarget);
  ASSERT_TRUE(heap_peer && shared_peer);
  EXPECT_EQ(heap_peer->memory.FindAccess("shm"), nullptr);
  EXPECT_NE(heap_peer->memory.FindAccess("ucx"), nullptr);
  for (bool shared_local : {false, true}) {
    auto l = MakeLocal(1 << 20, shared_local);
    ASSERT_TRUE(l);
    ASSERT_TRUE(l->engine->AddPeer(heap_peer->engine).ok());
    ASSERT_TRUE(l->engine->AddPeer(shared_peer->engine).ok());
    auto to_heap = l->engine->OpenSession(l->desc, heap_peer->memory);
    auto to_shared = l->engine->OpenSession(l->desc, shared_peer->memory);
    ASSERT_TRUE(to_heap.ok() && to_shared.ok());
    Transfer a = to_heap->Write(0, 0, 1 << 20);
    Transfer b = to_shared->Write(0, 0, 1 << 20);
    ASSERT_TRUE(a.Wait().ok() && b.Wait().ok());
    EXPECT_EQ(a.path().transport, "ucx");
    EXPECT_EQ(b.path().transport, "shm");
    EXPECT_EQ(heap_peer->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
    EXPECT_EQ(shared_peer->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
  }
}

TEST(ShmProcess, KilledTargetEndsEveryTransferAndOthersGoOn) {
  const size_t kBytes = 64 << 20;
  auto victim = PeerProcess::Start(kBytes, kSharedTarget);
  auto bystander = PeerProcess::Start(1 << 20, kSharedTarget);
  ASSERT_TRUE(victim && bystander);
  EngineOptions options;
  options.copy_threads = 2;
  options.parallel_copy_bytes = 1 << 20;
  auto l = MakeLocal(kBytes, false, options);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(victim->engine).ok());
  ASSERT_TRUE(l->engine->AddPeer(bystander->engine).ok());
  auto to_victim = l->engine->OpenSession(l->desc, victim->memory);
  ASSERT_TRUE(to_victim.ok());
  ASSERT_EQ(to_victim->path().transport, "shm");
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < kBytes; off += 64 << 10) ops.push_back({off, off, 64 << 10});
  TransferOptions deadline;
  deadline.deadline = std::chrono::seconds(20);
  std::vector<Transfer> transfers;
  for (int i = 0; i < 64; ++i) transfers.push_back(to_victim->WriteBatch(ops, deadline));
  ASSERT_TRUE(transfers[0].Wait().ok());
  victim->Kill(SIGKILL);
  auto start = Clock::now();
  int failed = 0;
  for (auto& t : transfers) {
    Status s = t.Wait();
    EXPECT_TRUE(s.ok() || s.code() == Code::kUnavailable) << s.ToString();
    failed += !s.ok();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_GT(failed, 0) << "every batch finished before the peer died; the test proves nothing";
  Status after = to_victim->Write(0, 0, 4096).Wait();
  EXPECT_EQ(after.code(), Code::kUnavailable) << after.ToString();

  auto to_bystander = l->engine->OpenSession(l->desc, bystander->memory);
  ASSERT_TRUE(to_bystander.ok());
  ASSERT_TRUE(to_bystander->Write(0, 0, 1 << 20).Wait().ok());
  EXPECT_EQ(bystander->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));

  // The peer restarts with a new descriptor: AddPeer reconnects.
  auto reborn = PeerProcess::Start(1 << 20, kSharedTarget);
  ASSERT_TRUE(reborn);
  ASSERT_TRUE(l->engine->AddPeer(reborn->engine).ok());
  auto again = l->engine->OpenSession(l->desc, reborn->memory);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->path().transport, "shm");
  ASSERT_TRUE(again->Write(0, 0, 1 << 20).Wait().ok());
  EXPECT_EQ(reborn->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
}

TEST(ShmProcess, StoppedTargetTakesWritesButNotificationsHitTheDeadline) {
  auto peer = PeerProcess::Start(1 << 20, kSharedTarget);
  ASSERT_TRUE(peer);
  auto l = MakeLocal(1 << 20, false);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(peer->engine).ok());
  auto s = l->engine->OpenSession(l->desc, peer->memory);
  ASSERT_TRUE(s.ok());
  peer->Signal(SIGSTOP);
  ASSERT_TRUE(peer->WaitStopped());
  // The copy needs no help from the target's threads.
  EXPECT_TRUE(s->Write(0, 0, 1 << 20).Wait().ok());
  TransferOptions options;
  options.deadline = std::chrono::milliseconds(500);
  options.notification = "never read";
  auto start = Clock::now();
  Status st = s->Write(0, 0, 4096, options).Wait();
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << st.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  peer->Signal(SIGCONT);
  EXPECT_EQ(peer->Command(HashCmd(0, 1 << 20)), HashOf(l->data(), 1 << 20));
}

// Notifications are one-way: a receiver that does not drain (stopped) fills its ring, and the
// sender hears of it; once it runs again it has every notification the sender was told went.
TEST(ShmProcess, StoppedReceiverFillsItsRingAndTheSenderHearsOfIt) {
  auto peer = PeerProcess::Start(4096, kSharedTarget);
  ASSERT_TRUE(peer);
  EngineOptions only_shm;
  only_shm.transports = {"shm"};
  auto l = MakeLocal(4096, true, only_shm);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(peer->engine).ok());
  ASSERT_TRUE(l->engine->Notify(peer->engine.key, "first").ok());
  EXPECT_EQ(peer->Command("notes"), "NOTES 1 first");
  peer->Signal(SIGSTOP);
  ASSERT_TRUE(peer->WaitStopped());
  const std::string big(60000, 'b');
  int sent = 0;
  Status s;
  while (sent < 1000 && (s = l->engine->Notify(peer->engine.key, big)).ok()) ++sent;
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent, 1000);
  peer->Signal(SIGCONT);
  auto until = Clock::now() + std::chrono::seconds(5);
  std::string notes;
  while ((notes = peer->Command("notes")).rfind("NOTES " + std::to_string(1 + sent) + " ", 0) != 0 &&
         Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(notes, "NOTES " + std::to_string(1 + sent) + " " + big);
  // Room again.
  EXPECT_TRUE(l->engine->Notify(peer->engine.key, "after").ok());
  EXPECT_EQ(peer->Command("stats"), "STATS 0 0");
}

// A receiver that was killed: notifications to it fail with kUnavailable soon after.
TEST(ShmProcess, NotificationsToAKilledReceiverFail) {
  auto peer = PeerProcess::Start(4096, kSharedTarget);
  ASSERT_TRUE(peer);
  EngineOptions only_shm;
  only_shm.transports = {"shm"};
  auto l = MakeLocal(4096, true, only_shm);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->engine->AddPeer(peer->engine).ok());
  ASSERT_TRUE(l->engine->Notify(peer->engine.key, "alive").ok());
  peer->Kill(SIGKILL);
  auto start = Clock::now();
  Status s;
  while ((s = l->engine->Notify(peer->engine.key, "dead?")).ok() && Clock::now() - start < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(l->engine->Notify(peer->engine.key, "again").code(), Code::kUnavailable);
}

TEST(ShmProcess, DeregistrationRevokesThePeersMapping) {
  auto l = MakeLocal(1 << 20, true);
  ASSERT_TRUE(l);
  auto peer = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->Command("write 0 0 65536"), "DONE OK");
  EXPECT_EQ(peer->Command(HashCmd(0, 65536)), HashOf(l->data(), 65536));
  auto start = Clock::now();
  ASSERT_TRUE(l->engine->DeregisterMemory(l->desc).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2)) << "the peer acknowledged at once";
  // The peer stopped using the region: nothing more lands in it.
  std::memset(l->data(), 0, 65536);
  EXPECT_EQ(peer->Command("write 0 0 65536"), "DONE FAILED_PRECONDITION");
  EXPECT_EQ(l->data()[0], 0);
  EXPECT_EQ(peer->Command("open " + Hex(l->desc.Pack())), "ERR FAILED_PRECONDITION");
  // Registered again, the same memory is reachable again.
  auto again = l->engine->RegisterMemory(l->data(), 1 << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(peer->Command("open " + Hex(again->Pack())), "SESSION shm");
  EXPECT_EQ(peer->Command("write 0 0 65536"), "DONE OK");
  EXPECT_EQ(peer->Command(HashCmd(0, 65536)), HashOf(l->data(), 65536));
}

TEST(ShmProcess, StoppedInitiatorDoesNotHoldDeregistrationPastItsDeadline) {
  EngineOptions options;
  options.shm.revoke_timeout = std::chrono::milliseconds(500);
  auto l = MakeLocal(1 << 20, true, options);
  ASSERT_TRUE(l);
  auto peer = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(peer);
  EXPECT_EQ(peer->Command("write 0 0 4096"), "DONE OK");
  peer->Signal(SIGSTOP);
  ASSERT_TRUE(peer->WaitStopped());
  auto start = Clock::now();
  ASSERT_TRUE(l->engine->DeregisterMemory(l->desc).ok());
  auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(400)) << "it waited for the peer's answer";
  EXPECT_LT(took, std::chrono::seconds(2));
  peer->Signal(SIGCONT);
  // The peer was disconnected (or saw the revocation first): its transfers fail.
  std::string after = peer->Command("write 0 0 4096");
  EXPECT_TRUE(after == "DONE UNAVAILABLE" || after == "DONE FAILED_PRECONDITION") << after;
}

TEST(ShmProcess, KilledInitiatorIsDropped) {
  auto l = MakeLocal(1 << 20, true);
  ASSERT_TRUE(l);
  auto peer = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(peer);
  ASSERT_EQ(peer->Command("write 0 0 1048576"), "DONE OK");
  // Writes in a loop, killed while they run.
  peer->Post("writes 1000000 1048576");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  peer->Kill(SIGKILL);
  auto start = Clock::now();
  ASSERT_TRUE(l->engine->DeregisterMemory(l->desc).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  // This engine keeps serving others.
  auto again = l->engine->RegisterMemory(l->data(), 1 << 20);
  ASSERT_TRUE(again.ok());
  l->desc = *again;
  auto next = StartInitiator(*l, 1 << 20);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->Command("write 0 0 4096"), "DONE OK");
  EXPECT_EQ(next->Command(HashCmd(0, 4096)), HashOf(l->data(), 4096));
}

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
    auto fd = internal::shm::DialAbstract(std::string(*name));
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    fd_ = fd.ok() ? *fd : -1;
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  void Send(const std::string& bytes, std::vector<int> pass_fds = {}) {
    ASSERT_TRUE(internal::shm::SendMessage(fd_, bytes, pass_fds, Deadline::After(std::chrono::seconds(5))).ok());
  }
  void Send(const internal::shm::Header& h, std::string_view payload = {}) { Send(internal::shm::Encode(h, payload)); }
  // The next message, waiting up to 5 s.
  internal::shm::Received Next() {
    auto until = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < until) {
      auto r = internal::shm::ReceiveMessage(fd_, 1 << 16);
      if (r.ok()) return *r;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "no reply";
    return {};
  }
  // kUnavailable once the engine closed the connection, kInProgress while it is open; other
  // messages are consumed.
  Code Poll() {
    auto r = internal::shm::ReceiveMessage(fd_, 1 << 16);
    if (r.ok()) {
      for (int f : r->fds) close(f);
      return Code::kOk;
    }
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
    for (int f : ring.fds) close(f);
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
    Header short_hello = hello;
    short_hello.size = 10;
    raw.Send(Encode(short_hello) + "abc");  // 6. payload shorter than its size
    Header unmapped;
    unmapped.type = MsgType::kUnmapped;
    raw.Send(Encode(unmapped), {STDIN_FILENO});  // 7. a descriptor nobody asked for
    Header ack;
    ack.type = MsgType::kAck;
    raw.Send(ack);  // 8. an initiator's message sent to a target
    raw.Send(Encode(open) + std::string(70000, 'x'));  // 9. longer than any message
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
    for (int f : reply.fds) close(f);
  }
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (l->engine->stats().rejected_messages < 10 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(l->engine->stats().rejected_messages, 10u);
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
  void* p = mmap(nullptr, r->length, PROT_READ | PROT_WRITE, MAP_SHARED, reply.fds[0], 0);
  close(reply.fds[0]);
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
        {
          auto until = Clock::now() + std::chrono::seconds(5);
          while (peer->Command("notes") != "NOTES " + std::to_string(notes + 1) + " " + good && Clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
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

TEST(ShmHostile, NotificationLargerThanTheReceiverTakesIsRefused) {
  EngineOptions big;
  big.max_notification_bytes = 512 << 10;
  auto a = MakeLocal(4096, true, big);
  auto b = MakeLocal(4096, true);  // takes 64 KiB
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->engine->AddPeer(b->engine->Describe()).ok());
  EXPECT_EQ(a->engine->Notify(b->engine->key(), std::string(100000, 'x')).code(), Code::kInvalidArgument);
  ASSERT_TRUE(a->engine->Notify(b->engine->key(), std::string(60000, 'y')).ok());
  auto got = b->engine->PopNotifications();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message.size(), 60000u);
  EXPECT_EQ(b->engine->stats().rejected_messages, 0u) << "refused, not malformed";
}

}  // namespace
}  // namespace ferry
