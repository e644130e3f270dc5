// The ucx transport against hostile peers and careless users: bytes that are not ferry's
// handshake at the listener, a listener that answers with such bytes, idle connections that
// never finish the handshake, connections that claim another engine's key, messages that name
// no connection, regions reached without their key, and peers that are stopped.
#include <gtest/gtest.h>

#include <ucp/api/ucp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "base/codec.h"
#include "ferry/engine.h"
#include "testing/bytes.h"
#include "testing/loopback.h"
#include "testing/peer_process.h"
#include "testing/ucx_local.h"
#include "transport/ucx/am_wire.h"
#include "transport/ucx/core.h"
#include "transport/ucx/door.h"

namespace ferry {
namespace {

using testing::PeerProcess;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

using Local = testing::UcxLocal;

Local MakeLocal(size_t bytes, std::string key = "target", UcxOptions ucx = {}) {
  EngineOptions options;
  options.key = std::move(key);
  options.ucx = ucx;
  return testing::MakeUcxLocal(bytes, options);
}

uint16_t PortOf(const std::string& address) { return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))); }

int ConnectTcp(uint16_t port) {
  auto [fd, rc] = testing::DialLoopback(port);
  if (rc != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A session from l's region to `region` as the region of the engine named `key`.
Result<Session> OpenAs(Local& l, MemoryDesc region, const std::string& key) {
  region.engine_key = key;
  return l.engine->OpenSession(l.desc, region);
}

// Whether the other side closed `fd` within `d`.
bool ClosedWithin(int fd, std::chrono::milliseconds d) {
  pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(d.count())) <= 0) return false;
  char c;
  return recv(fd, &c, 1, 0) <= 0;
}

// A real peer still reaches the engine: a child process writes into it.
void ExpectServes(Local& l) {
  auto peer = PeerProcess::Start(4096);
  ASSERT_TRUE(peer);
  ASSERT_TRUE(l.engine->AddPeer(peer->engine).ok());
  auto s = l.engine->OpenSession(l.desc, peer->memory);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->Write(0, 0, 4096).Wait().ok());
  ASSERT_TRUE(l.engine->RemovePeer(peer->engine.key).ok());
}

// Bytes that are not ferry's handshake (in UCX 1.13 64 zero bytes or 16 bytes of 0xff sent to
// its sockaddr listener aborted the process) are refused, and the engine goes on serving.
TEST(UcxDoor, BytesThatAreNotAHandshakeAreRefused) {
  Local l = MakeLocal(4096);
  const uint16_t port = PortOf(l.engine->Describe().addresses.front());
  std::vector<std::string> junk = {std::string(64, '\0'), std::string(16, '\xff'), "GET / HTTP/1.0\r\n\r\n",
                                   std::string(1 << 16, 'x')};
  std::mt19937 rng(3);
  for (int i = 0; i < 30; ++i) {
    std::string r(1 + rng() % 200, '\0');
    for (auto& c : r) c = static_cast<char>(rng());
    junk.push_back(r);
  }
  for (const auto& bytes : junk) {
    int fd = ConnectTcp(port);
    ASSERT_GE(fd, 0);
    (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(ClosedWithin(fd, 2000ms)) << "junk of " << bytes.size() << " bytes left the connection open";
    close(fd);
  }
  ExpectServes(l);
}

// The initiator's side: a "peer" whose descriptor points at a server that answers with junk,
// or says nothing, fails open_session with an error, bounded by ucx.connect_timeout.
TEST(UcxDoor, AListenerThatIsNotFerryFailsTheSessionCleanly) {
  UcxOptions ucx;
  ucx.connect_timeout = 500ms;
  Local l = MakeLocal(4096, "initiator", ucx);
  testing::LoopbackListener listener(8);
  const int server = listener.fd;
  ASSERT_NE(listener.port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(listener.port);
  std::atomic<int> mode{0};  // 0: junk, 1: silent
  std::atomic<bool> stop{false};
  std::thread t([&] {
    std::vector<int> held;
    while (!stop) {
      pollfd p = {server, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int fd = accept(server, nullptr, nullptr);
      if (fd < 0) continue;
      if (mode == 0) {
        std::string zeros(64, '\0');
        (void)!send(fd, zeros.data(), zeros.size(), MSG_NOSIGNAL);
      }
      held.push_back(fd);
    }
    for (int fd : held) close(fd);
  });
  // A descriptor of a real engine, but with its ucx address replaced by the server's.
  EngineDesc fake = l.engine->Describe();
  fake.key = "fake";
  codec::Writer w;
  w.Array(1);
  w.Str(address);
  for (auto& tr : fake.transports)
    if (tr.transport == "ucx") tr.data = w.Take();
  fake.addresses = {address};
  fake.host_id = "elsewhere";
  ASSERT_TRUE(l.engine->AddPeer(fake).ok());
  auto s = OpenAs(l, l.desc, "fake");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << s.status().ToString();
  mode = 1;
  auto start = Clock::now();
  s = OpenAs(l, l.desc, "fake");
  auto took = Clock::now() - start;
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status().ToString();
  EXPECT_NE(s.status().message().find("did not answer"), std::string_view::npos) << s.status().ToString();
  EXPECT_LT(took, 3s);
  stop = true;
  t.join();
}

// Connections that never finish the handshake are bounded in number and in time: with far more
// of them than the engine keeps, a real peer still gets in, and each is closed by the timeout.
TEST(UcxDoor, IdleConnectionsDoNotLockPeersOut) {
  UcxOptions ucx;
  ucx.max_pending_handshakes = 16;
  ucx.handshake_timeout = 300ms;
  Local l = MakeLocal(4096, "target", ucx);
  const uint16_t port = PortOf(l.engine->Describe().addresses.front());
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    int fd = ConnectTcp(port);
    if (fd >= 0) idle.push_back(fd);
  }
  ASSERT_GT(idle.size(), 100u);
  ExpectServes(l);
  int closed = 0;
  for (int fd : idle) {
    closed += ClosedWithin(fd, 2000ms);
    close(fd);
  }
  EXPECT_EQ(closed, static_cast<int>(idle.size())) << "idle connections were kept past the handshake timeout";
}

// Refusals for want of room are counted (EngineStats::connections_refused): a hello past
// ucx.max_connections is refused with kResourceExhausted, and a flood of connections that never
// finish the handshake past ucx.max_pending_handshakes drops the oldest.
TEST(UcxDoor, RefusalsPastTheLimitsAreCounted) {
  UcxOptions ucx;
  ucx.max_pending_handshakes = 4;
  ucx.max_connections = 1;
  ucx.handshake_timeout = 5s;
  Local l = MakeLocal(4096, "target", ucx);
  EXPECT_EQ(l.engine->stats().connections_refused, 0u);
  Local first = MakeLocal(4096, "first");
  Local second = MakeLocal(4096, "second");
  ASSERT_TRUE(first.engine->AddPeer(l.engine->Describe()).ok());
  ASSERT_TRUE(second.engine->AddPeer(l.engine->Describe()).ok());
  auto in = first.engine->OpenSession(first.desc, l.desc);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_TRUE(in->Write(0, 0, 4096).Wait().ok());
  const uint64_t connections = l.engine->stats().connections_refused;
  auto out = second.engine->OpenSession(second.desc, l.desc);
  ASSERT_FALSE(out.ok()) << "a connection past ucx.max_connections was admitted";
  EXPECT_EQ(out.status().code(), Code::kResourceExhausted) << out.status().ToString();
  EXPECT_GT(l.engine->stats().connections_refused, connections);

  const uint64_t before = l.engine->stats().connections_refused;
  const uint16_t port = PortOf(l.engine->Describe().addresses.front());
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    int fd = ConnectTcp(port);
    if (fd >= 0) idle.push_back(fd);
  }
  ASSERT_EQ(idle.size(), 20u);
  // The door accepts on its own thread: 20 idle handshakes, 4 kept, at least 16 dropped.
  const uint64_t want = before + idle.size() - ucx.max_pending_handshakes;
  for (auto until = Clock::now() + 5s; Clock::now() < until && l.engine->stats().connections_refused < want;)
    std::this_thread::sleep_for(10ms);
  EXPECT_GE(l.engine->stats().connections_refused, want);
  // Refusals that are not for want of room (a silent peer at the timeout) are not counted here.
  EXPECT_LE(l.engine->stats().connections_refused, want + 1);
  for (int fd : idle) close(fd);
}

// A hello whose worker address is not of this UCX's format (random bytes crashed UCX 1.13's
// address parser in most cases) is refused before UCX sees it.
TEST(UcxDoor, WorkerAddressesOfAnotherFormatAreRefused) {
  Local l = MakeLocal(4096);
  const std::string address = l.engine->Describe().addresses.front();
  std::mt19937 rng(5);
  for (int i = 0; i < 20; ++i) {
    std::string bogus(1 + rng() % 400, '\0');
    for (auto& c : bogus) c = static_cast<char>(rng());
    bogus[0] = static_cast<char>(0x0f ^ (i & 0xf0));  // never the header byte UCX 1.13 writes (0x20)
    internal::ucx::Hello hello{"mallory", "target", 1, bogus};
    auto d = internal::ucx::Dial(address, hello, Deadline::After(2s));
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument) << d.status().ToString();
  }
  ExpectServes(l);
}

// A descriptor names an engine key and an address: an engine at that address with another key
// is refused before any byte moves.
TEST(UcxDoor, TheKeyOfADescriptorIsTiedToItsAddress) {
  Local target = MakeLocal(4096, "target");
  Local initiator = MakeLocal(4096, "initiator");
  EngineDesc impostor = target.engine->Describe();
  impostor.key = "somebody-else";
  ASSERT_TRUE(initiator.engine->AddPeer(impostor).ok());
  auto s = OpenAs(initiator, target.desc, "somebody-else");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kFailedPrecondition) << s.status().ToString();
  EXPECT_NE(s.status().message().find("not 'somebody-else'"), std::string_view::npos) << s.status().ToString();
}

// open_session to a stopped peer ends within ucx.connect_timeout, as UNAVAILABLE, naming the
// peer, not as a transfer's deadline.
TEST(UcxDoor, AStoppedPeerFailsOpenSessionWithinTheConnectTimeout) {
  UcxOptions ucx;
  ucx.connect_timeout = 700ms;
  Local l = MakeLocal(4096, "initiator", ucx);
  auto peer = PeerProcess::Start(4096);
  ASSERT_TRUE(peer);
  ASSERT_TRUE(l.engine->AddPeer(peer->engine).ok());
  peer->Signal(SIGSTOP);
  ASSERT_TRUE(peer->WaitStopped());
  auto start = Clock::now();
  auto s = l.engine->OpenSession(l.desc, peer->memory);
  auto took = Clock::now() - start;
  peer->Signal(SIGCONT);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status().ToString();
  EXPECT_EQ(s.status().message().find("transfer 0"), std::string_view::npos) << s.status().ToString();
  EXPECT_LT(took, 3s);
  EXPECT_GE(took, 600ms);
}

// A raw UCX client that completed ferry's handshake under a key of its own: the listener knows
// it by the connection, not by what its messages say.
class RawClient {
 public:
  RawClient(const std::string& address, const std::string& from, const std::string& to) {
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    EXPECT_EQ(ucp_init(&params, nullptr, &context_), UCS_OK);
    ucp_worker_params_t wp = {};
    EXPECT_EQ(ucp_worker_create(context_, &wp, &worker_), UCS_OK);
    ucp_am_handler_param_t am = {};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = internal::ucx::kAmId;
    am.arg = this;
    am.cb = [](void* arg, const void* header, size_t length, void*, size_t, const ucp_am_recv_param_t*) {
      auto h = internal::ucx::DecodeHeader(header, length, 0);
      if (h.ok() && h->type == internal::ucx::MsgType::kAck) static_cast<RawClient*>(arg)->acks_.push_back(h->code);
      return UCS_OK;
    };
    EXPECT_EQ(ucp_worker_set_am_recv_handler(worker_, &am), UCS_OK);
    ucp_address_t* mine = nullptr;
    size_t mine_len = 0;
    EXPECT_EQ(ucp_worker_get_address(worker_, &mine, &mine_len), UCS_OK);
    internal::ucx::Hello hello{from, to, 1, std::string(reinterpret_cast<const char*>(mine), mine_len)};
    ucp_worker_release_address(worker_, mine);
    auto d = internal::ucx::Dial(address, hello, Deadline::After(5s));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (!d.ok()) return;
    control_ = d->control;
    conn_ = d->welcome.conn_id;
    ucp_ep_params_t ep = {};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.address = reinterpret_cast<const ucp_address_t*>(d->welcome.worker_address.data());
    EXPECT_EQ(ucp_ep_create(worker_, &ep, &ep_), UCS_OK);
  }
  ~RawClient() {
    if (ep_ != nullptr) {
      ucp_request_param_t p = {};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(ep_, &p);
      if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    }
    if (control_ >= 0) close(control_);
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  uint64_t conn() const { return conn_; }
  const std::vector<uint8_t>& acks() const { return acks_; }
  void Send(const void* header, size_t header_len, const void* data, size_t len) {
    ucp_request_param_t p = {};
    void* req = ucp_am_send_nbx(ep_, internal::ucx::kAmId, header, header_len, data, len, &p);
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
  }
  void Progress(std::chrono::milliseconds d) {
    auto until = Clock::now() + d;
    while (Clock::now() < until) ucp_worker_progress(worker_);
  }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  int control_ = -1;
  uint64_t conn_ = 0;
  std::vector<uint8_t> acks_;
};

TEST(UcxHostile, MalformedMessagesAreRejectedAndCounted) {
  Local l = MakeLocal(4096);
  std::vector<uint8_t> before = l.buf;
  EngineDesc d = l.engine->Describe();
  {
    RawClient raw(d.addresses.front(), "mallory", "target");
    ASSERT_NE(raw.conn(), 0u);
    using namespace internal::ucx;
    uint8_t h[kAmHeaderBytes];
    std::vector<uint8_t> payload(4096, 0xAB);
    AmHeader good;
    good.type = MsgType::kWrite;
    good.region = static_cast<uint64_t>(l.desc.region);
    good.key = *AccessKey(l.desc);
    good.conn = raw.conn();
    good.token = 1;
    // 1. truncated header
    EncodeHeader(good, h);
    raw.Send(h, 10, nullptr, 0);
    // 2. bad version
    h[0] = 99;
    raw.Send(h, sizeof(h), nullptr, 0);
    // 3. write to an unknown region
    AmHeader x = good;
    x.region = 12345;
    x.size = 16;
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), payload.data(), 16);
    // 4. write past the end of the region
    x = good;
    x.offset = 4090;
    x.size = 16;
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), payload.data(), 16);
    // 5. size that does not match the payload
    x = good;
    x.size = 4096;
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), payload.data(), 8);
    // 6. offset + size overflowing 64 bits, large payload (rendezvous)
    x = good;
    x.offset = UINT64_MAX - 100;
    x.size = payload.size();
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), payload.data(), payload.size());
    // 7. read request out of range
    x = good;
    x.type = MsgType::kReadReq;
    x.offset = 4000;
    x.size = 200;
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), nullptr, 0);
    // 8. the right region without its key (ids are small and sequential; keys are not)
    x = good;
    x.key = good.key + 1;
    x.size = 16;
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), payload.data(), 16);
    // 9. a connection id this engine never gave
    x = good;
    x.conn = raw.conn() ^ 1;
    x.size = 16;
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), payload.data(), 16);
    // 10. a message of the retired type 1 (kHello, never sent by ferry)
    x = good;
    x.type = MsgType::kAck;
    x.size = 0;
    EncodeHeader(x, h);
    h[1] = 1;
    raw.Send(h, sizeof(h), nullptr, 0);
    // 11. a check of the region without its key
    x = good;
    x.type = MsgType::kCheck;
    x.key = 0;
    x.offset = reinterpret_cast<uint64_t>(l.buf.data());
    x.size = 4096;
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), nullptr, 0);
    // A notification whose payload names another engine comes from the connection's engine.
    x = good;
    x.type = MsgType::kNotify;
    x.token = 0;
    const std::string forged = std::string("\x09\x00", 2) + "prefill-0hello";
    x.size = forged.size();
    EncodeHeader(x, h);
    raw.Send(h, sizeof(h), forged.data(), forged.size());
    raw.Progress(300ms);
    // Every request that got an answer was refused.
    for (uint8_t code : raw.acks()) EXPECT_NE(code, 0) << "a hostile request was served";
  }
  auto deadline = Clock::now() + 5s;
  while (l.engine->stats().rejected_messages < 10 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(l.engine->stats().rejected_messages, 10u);
  EXPECT_EQ(l.buf, before) << "a rejected message changed registered memory";
  auto notes = l.engine->PopNotifications();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].from, "mallory");
  ExpectServes(l);
}

}  // namespace
}  // namespace ferry
