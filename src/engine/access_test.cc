// Access lists (RegionOptions::allowed_peers): a region registered for named peers only is
// read and written by those peers, and every other peer is refused with kPermissionDenied
// before any byte moves, counted (EngineStats::access_denied, ferry_access_denied_total), while
// the engine goes on serving the allowed peer and its other regions. Over ucx, shm and local,
// with and without a secret; over ucx also a peer that skips the session's check and sends
// requests by hand, and child processes; over cuda_ipc (with a GPU) a restricted region is not
// exported, and peers reach it through ucx. Also the shm socket's check of its peers' user
// (SO_PEERCRED, ShmOptions::allowed_uids).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/tsan.h"
#include "cuda/runtime.h"
#include "ferry/engine.h"
#include "ferry/metrics.h"
#include "ferry/shared_memory.h"
#include "testing/other_user.h"
#include "testing/peer_process.h"
#include "testing/shm_socket.h"
#include "testing/ucx_raw_client.h"
#include "transport/ucx/access_wire.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using testing::Hex;
using testing::PeerProcess;

constexpr char kSecret[] = "access-list-secret-0123456789";
constexpr uint64_t kBytes = 4096;
constexpr char kTarget[] = "acc-target";
constexpr char kAllowed[] = "acc-allowed";
constexpr char kDenied[] = "acc-denied";

// An engine with two regions, each in a shared buffer of its own (shm hands out a buffer's
// memory file): `closed`, for kAllowed only when `restrict` is set, and `open`, for every peer.
struct Side {
  HostBuffer closed_buf, open_buf;  // first: freed after the engine
  std::unique_ptr<Engine> engine;
  MemoryDesc closed, open;
  uint8_t* closed_bytes() const { return reinterpret_cast<uint8_t*>(closed_buf.data()); }
};

Side Make(const std::string& key, const std::string& transport, bool secret, bool restrict = false,
          UcxOptions ucx = {}) {
  Side s;
  EngineOptions o;
  o.key = key;
  o.transports = {transport};
  if (secret) o.secret = kSecret;
  o.ucx = ucx;
  o.ucx.connect_timeout = 3s;
  o.shm.call_timeout = 3s;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return s;
  s.engine = std::move(e).value();
  auto a = AllocateSharedHost(kBytes), b = AllocateSharedHost(kBytes);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return s;
  s.closed_buf = std::move(a).value();
  s.open_buf = std::move(b).value();
  RegionOptions ro;
  if (restrict) ro.allowed_peers = {kAllowed};
  auto c = s.engine->RegisterMemory(s.closed_buf.data(), kBytes, MemoryKind::kHost, -1, ro);
  auto d = s.engine->RegisterMemory(s.open_buf.data(), kBytes);
  EXPECT_TRUE(c.ok() && d.ok()) << c.status().ToString() << " " << d.status().ToString();
  if (c.ok()) s.closed = *c;
  if (d.ok()) s.open = *d;
  return s;
}

Result<Session> Open(Side& from, const MemoryDesc& local, const Side& to, const MemoryDesc& remote) {
  FERRY_RETURN_IF_ERROR(from.engine->AddPeer(to.engine->Describe()));
  return from.engine->OpenSession(local, remote);
}

Status Write(const Session& s) {
  TransferOptions o;
  o.deadline = 3s;
  return s.Write(0, 0, kBytes, o).Wait();
}

Status Read(const Session& s) {
  TransferOptions o;
  o.deadline = 3s;
  return s.Read(0, 0, kBytes, o).Wait();
}

// Whether every byte of a region is `v`. Bytes that UCX writes for another process (a child, a
// raw client) are ordered with this read by messages TSan cannot see (pipes to children,
// sockets): the read acquires what came before and releases to what the next message brings.
bool All(const void* p, uint8_t v) {
  FERRY_TSAN_WIRE_ACQUIRE();
  const auto* b = static_cast<const uint8_t*>(p);
  bool all = true;
  for (uint64_t i = 0; i < kBytes && all; ++i) all = b[i] == v;
  FERRY_TSAN_WIRE_RELEASE();
  return all;
}

// Parameters: the transport, and whether the engines share a secret.
class AccessList : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  const std::string& transport() const { return std::get<0>(GetParam()); }
  bool secret() const { return std::get<1>(GetParam()); }
};

TEST_P(AccessList, AllowedPeerReadsAndWritesOthersAreRefusedAndCounted) {
  Side target = Make(kTarget, transport(), secret(), /*restrict=*/true);
  Side allowed = Make(kAllowed, transport(), secret());
  Side denied = Make(kDenied, transport(), secret());
  ASSERT_TRUE(target.engine && allowed.engine && denied.engine);

  // The allowed peer writes the region, then reads what the target put there.
  std::memset(allowed.closed_buf.data(), 0x5a, kBytes);
  auto a = Open(allowed, allowed.closed, target, target.closed);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(Write(*a).ok());
  EXPECT_TRUE(All(target.closed_buf.data(), 0x5a));
  std::memset(target.closed_buf.data(), 0x77, kBytes);
  ASSERT_TRUE(Read(*a).ok());
  EXPECT_TRUE(All(allowed.closed_buf.data(), 0x77));

  // Any other peer is refused before a byte moves: the message names the region only.
  std::memset(denied.closed_buf.data(), 0xee, kBytes);
  auto d = Open(denied, denied.closed, target, target.closed);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kPermissionDenied) << d.status().ToString();
  const std::string region = "region " + std::to_string(static_cast<uint64_t>(target.closed.region));
  EXPECT_NE(d.status().message().find(region), std::string_view::npos) << d.status().ToString();
  EXPECT_EQ(target.engine->stats().access_denied, 1u);
  EXPECT_EQ(target.engine->stats().rejected_messages, 0u);
  EXPECT_TRUE(All(target.closed_buf.data(), 0x77));

  // The denied peer still reaches the target's other regions, and the allowed one still
  // reaches this one.
  auto o = Open(denied, denied.closed, target, target.open);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(Write(*o).ok());
  EXPECT_TRUE(All(target.open_buf.data(), 0xee));
  std::memset(allowed.closed_buf.data(), 0x33, kBytes);
  EXPECT_TRUE(Write(*a).ok());
  EXPECT_TRUE(All(target.closed_buf.data(), 0x33));

  // Each refusal counts; the Prometheus text carries the counter.
  auto again = denied.engine->OpenSession(denied.closed, target.closed);
  EXPECT_EQ(again.status().code(), Code::kPermissionDenied) << again.status().ToString();
  EXPECT_EQ(target.engine->stats().access_denied, 2u);
  EXPECT_EQ(denied.engine->stats().access_denied, 0u);
  const std::string text = RenderPrometheus(target.engine->Metrics());
  EXPECT_NE(text.find("ferry_access_denied_total{engine=\"" + std::string(kTarget) + "\"} 2\n"), std::string::npos)
      << text;
  EXPECT_TRUE(All(target.closed_buf.data(), 0x33));
}

// The target's own sessions to its restricted region (itself is always allowed).
TEST_P(AccessList, TheOwnerAlwaysReachesItsRegion) {
  Side target = Make(kTarget, transport(), secret(), /*restrict=*/true);
  ASSERT_TRUE(target.engine);
  std::memset(target.open_buf.data(), 0x42, kBytes);
  auto s = target.engine->OpenSession(target.open, target.closed);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(Write(*s).ok());
  EXPECT_TRUE(All(target.closed_buf.data(), 0x42));
  EXPECT_EQ(target.engine->stats().access_denied, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, AccessList,
                         ::testing::Combine(::testing::Values("ucx", "shm", "local"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_secret" : "_nosecret");
                         });

TEST(AccessListOptions, BadKeysAreRefused) {
  auto e = Engine::Create([] {
    EngineOptions o;
    o.key = "acc-opts";
    o.transports = {"local"};
    return o;
  }());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> buf(64);
  RegionOptions empty_key{{"a", ""}};
  EXPECT_EQ((*e)->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost, -1, empty_key).status().code(),
            Code::kInvalidArgument);
  RegionOptions long_key{{std::string(kMaxKeyBytes + 1, 'k')}};
  EXPECT_EQ((*e)->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost, -1, long_key).status().code(),
            Code::kInvalidArgument);
  RegionOptions fine{{"a", "a", "b"}};
  EXPECT_TRUE((*e)->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost, -1, fine).ok());
}

// Over ucx a restricted region's descriptor carries no RDMA remote key, so that RMA (which no
// handler sees) cannot reach it: initiators that use RMA go through active messages for it.
TEST(AccessListUcx, NoRemoteKeyIsPublishedAndRmaInitiatorsFallBack) {
  UcxOptions rma;
  rma.rma = UcxOptions::Rma::kAlways;
  Side target = Make(kTarget, "ucx", false, /*restrict=*/true);
  Side allowed = Make(kAllowed, "ucx", false, false, rma);
  ASSERT_TRUE(target.engine && allowed.engine);
  ASSERT_TRUE(internal::ucx::AccessKey(target.closed).ok());
  EXPECT_FALSE(internal::ucx::HasRemoteKey(target.closed));
  EXPECT_EQ(internal::ucx::AccessRest(target.closed), internal::ucx::kNoRemoteKey);
  EXPECT_TRUE(internal::ucx::HasRemoteKey(target.open));
  std::memset(allowed.closed_buf.data(), 0x61, kBytes);
  auto s = Open(allowed, allowed.closed, target, target.closed);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(Write(*s).ok());
  EXPECT_TRUE(All(target.closed_buf.data(), 0x61));
}

// A peer that skips OpenSession's check and sends requests by hand, with the region's key (a
// leaked descriptor): each request is refused with kPermissionDenied, answered with the
// region's id, counted, never rejected as malformed, and no byte moves; who asks is the
// engine that made the connection. The same requests from the allowed key are served.
class AccessListUcxRaw : public ::testing::TestWithParam<bool> {};

TEST_P(AccessListUcxRaw, RequestsThatSkipTheCheckAreRefusedOneByOne) {
  const bool secret = GetParam();
  Side target = Make(kTarget, "ucx", secret, /*restrict=*/true);
  ASSERT_TRUE(target.engine);
  std::memset(target.closed_buf.data(), 0x77, kBytes);
  const std::string address = target.engine->Describe().addresses.front();
  using namespace internal::ucx;
  AmHeader base;
  base.region = static_cast<uint64_t>(target.closed.region);
  base.key = *AccessKey(target.closed);
  std::vector<uint8_t> payload(64, 0xab);
  std::vector<AmHeader> requests;
  {
    AmHeader h = base;
    h.type = MsgType::kCheck;
    h.offset = target.closed.address;
    h.size = kBytes;
    requests.push_back(h);
    h = base;
    h.type = MsgType::kWrite;
    h.size = payload.size();
    requests.push_back(h);
    h = base;
    h.type = MsgType::kReadReq;
    h.size = 64;
    requests.push_back(h);
  }
  {
    testing::UcxRawClient raw(address, "mallory", kTarget, secret ? kSecret : "");
    ASSERT_NE(raw.conn(), 0u);
    uint64_t token = 1;
    for (AmHeader h : requests) {
      h.token = token++;
      raw.Send(h, h.type == MsgType::kWrite ? payload.data() : nullptr, h.type == MsgType::kWrite ? h.size : 0);
    }
    // A staged write and a staged read (the GPU path's messages, which reach host memory too).
    AmHeader h = base;
    h.type = MsgType::kStagedWrite;
    h.token = token++;
    h.size = payload.size();
    raw.Send(h, payload.data(), payload.size());
    raw.WaitAcks(requests.size() + 1, 3s);
    ASSERT_EQ(raw.acks().size(), requests.size() + 1);
    for (const AmHeader& ack : raw.acks()) {
      EXPECT_EQ(ack.code, static_cast<uint8_t>(Code::kPermissionDenied));
      EXPECT_EQ(ack.region, base.region);
    }
    EXPECT_EQ(raw.read_responses(), 0);
  }
  EXPECT_EQ(target.engine->stats().access_denied, requests.size() + 1);
  EXPECT_EQ(target.engine->stats().rejected_messages, 0u);
  EXPECT_TRUE(All(target.closed_buf.data(), 0x77)) << "a refused request changed the region";

  // The allowed key, on a connection of its own, is served.
  testing::UcxRawClient ok(address, kAllowed, kTarget, secret ? kSecret : "");
  ASSERT_NE(ok.conn(), 0u);
  AmHeader w = requests[1];
  w.token = 99;
  ok.Send(w, payload.data(), payload.size());
  ok.WaitAcks(1, 3s);
  ASSERT_EQ(ok.acks().size(), 1u);
  EXPECT_EQ(ok.acks()[0].code, 0);
  FERRY_TSAN_WIRE_ACQUIRE();  // the ack left after the bytes landed (Shard::Send releases)
  EXPECT_EQ(target.closed_bytes()[0], 0xab);
  EXPECT_EQ(target.closed_bytes()[payload.size()], 0x77);
  EXPECT_EQ(target.engine->stats().access_denied, requests.size() + 1);
}

INSTANTIATE_TEST_SUITE_P(Secret, AccessListUcxRaw, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "secret" : "nosecret"); });

// Across processes: ferry_test_peer children as the allowed and the refused initiator.
TEST(AccessListProcess, ChildPeersAreAllowedOrRefused) {
  Side target = Make(kTarget, "ucx", false, /*restrict=*/true);
  ASSERT_TRUE(target.engine);
  std::memset(target.closed_buf.data(), 0x77, kBytes);
  const std::string peer = "peer " + Hex(target.engine->Describe().Pack());
  auto refused = PeerProcess::Start(kBytes, {"--key", kDenied});
  ASSERT_TRUE(refused);
  ASSERT_EQ(refused->Command(peer), "OK");
  EXPECT_EQ(refused->Command("open " + Hex(target.closed.Pack())), "ERR PERMISSION_DENIED");
  EXPECT_EQ(target.engine->stats().access_denied, 1u);
  EXPECT_TRUE(All(target.closed_buf.data(), 0x77));
  ASSERT_EQ(refused->Command("open " + Hex(target.open.Pack())), "SESSION ucx");
  EXPECT_EQ(refused->Command("write 0 0 4096"), "DONE OK");

  auto allowed = PeerProcess::Start(kBytes, {"--key", kAllowed});
  ASSERT_TRUE(allowed);
  ASSERT_EQ(allowed->Command(peer), "OK");
  ASSERT_EQ(allowed->Command("open " + Hex(target.closed.Pack())), "SESSION ucx");
  EXPECT_EQ(allowed->Command("write 0 0 4096"), "DONE OK");
  EXPECT_FALSE(All(target.closed_buf.data(), 0x77)) << "the allowed child's write did not land";
  EXPECT_EQ(allowed->Command("read 0 0 4096"), "DONE OK");
  EXPECT_EQ(target.engine->stats().access_denied, 1u);
}

// ---- Peer credentials on the shm socket (SO_PEERCRED) ----

// Another user's process is refused at accept and counted, unless ShmOptions::allowed_uids
// names its user; the engine's own user always gets in. Needs root, to become another user.
TEST(PeerCredentials, AnotherUsersProcessIsRefusedUnlessAllowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user";
  constexpr uid_t kOther = testing::kNobody;
  for (bool allowed : {false, true}) {
    SCOPED_TRACE(allowed ? "allowed" : "not allowed");
    EngineOptions o;
    o.key = kTarget;
    o.transports = {"shm"};
    if (allowed) o.shm.allowed_uids = {1234, kOther};
    auto target = Engine::Create(o);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    const std::string name = testing::ShmSocketName((*target)->Describe());
    ASSERT_FALSE(name.empty());
    const uint64_t rejected = (*target)->stats().rejected_messages;
    EXPECT_EQ(testing::ConnectAsUser(kOther, name, true, allowed ? 300 : 3000), allowed ? 1 : 0);
    EXPECT_EQ((*target)->stats().rejected_messages, rejected + (allowed ? 0 : 1));
    EXPECT_EQ(testing::ConnectAsUser(geteuid(), name, true, 300), 1) << "the engine's own user was refused";
    // It still serves a peer engine of its own user.
    Side target_side;
    target_side.engine = std::move(target).value();
    Side peer = Make(kAllowed, "shm", false);
    ASSERT_TRUE(peer.engine);
    auto buf = AllocateSharedHost(kBytes);
    ASSERT_TRUE(buf.ok());
    auto region = target_side.engine->RegisterMemory(buf->data(), kBytes);
    ASSERT_TRUE(region.ok());
    auto session = Open(peer, peer.open, target_side, *region);
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    EXPECT_TRUE(Write(*session).ok());
    ASSERT_TRUE(target_side.engine->DeregisterMemory(*region).ok());
  }
}

// cuda_ipc: a restricted GPU region is not exported (its IPC handle would be open to every
// process of the host); ucx (staged) carries it, checking each request.
TEST(AccessListCuda, RestrictedGpuRegionsAreNotExportedOverCudaIpc) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  EngineOptions o;
  o.key = kTarget;
  o.transports = {"cuda_ipc", "ucx"};
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto mem = cuda::Malloc(0, 2 * kBytes);
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  ASSERT_TRUE(cuda::MemsetSync(*mem, 0x77, 2 * kBytes).ok());
  auto* base = static_cast<std::byte*>(*mem);
  RegionOptions ro;
  ro.allowed_peers = {kAllowed};
  auto closed = (*e)->RegisterMemory(base, kBytes, MemoryKind::kCuda, 0, ro);
  auto open = (*e)->RegisterMemory(base + kBytes, kBytes, MemoryKind::kCuda, 0);
  ASSERT_TRUE(closed.ok() && open.ok()) << closed.status().ToString() << " " << open.status().ToString();
  EXPECT_EQ(closed->FindAccess("cuda_ipc"), nullptr);
  EXPECT_NE(closed->FindAccess("ucx"), nullptr);

  const std::string peer = "peer " + Hex((*e)->Describe().Pack());
  auto refused = PeerProcess::Start(kBytes, {"--key", kDenied, "--transports", "cuda_ipc,ucx"});
  auto allowed = PeerProcess::Start(kBytes, {"--key", kAllowed, "--transports", "cuda_ipc,ucx"});
  ASSERT_TRUE(refused && allowed);
  ASSERT_EQ(refused->Command(peer), "OK");
  ASSERT_EQ(allowed->Command(peer), "OK");
  EXPECT_EQ(refused->Command("open " + Hex(closed->Pack())), "ERR PERMISSION_DENIED");
  EXPECT_EQ((*e)->stats().access_denied, 1u);
  ASSERT_EQ(allowed->Command("open " + Hex(closed->Pack())), "SESSION ucx");
  EXPECT_EQ(allowed->Command("write 0 0 4096"), "DONE OK");
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(cuda::CopySync(back.data(), base, kBytes).ok());
  EXPECT_NE(back[0], 0x77) << "the allowed child's write did not land";
  // The refused child still reaches the open region.
  EXPECT_EQ(refused->Command("open " + Hex(open->Pack())).rfind("SESSION ", 0), 0u);
  EXPECT_EQ(refused->Command("write 0 0 4096"), "DONE OK");
  refused.reset();
  allowed.reset();
  ASSERT_TRUE((*e)->DeregisterMemory(*closed).ok());
  ASSERT_TRUE((*e)->DeregisterMemory(*open).ok());
  e->reset();
  (void)cuda::Free(*mem);
}

}  // namespace
}  // namespace ferry
