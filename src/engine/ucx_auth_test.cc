// Authenticated peers over ucx (EngineOptions::secret): engines that share the secret connect;
// a wrong secret, no secret, a raw client that skips the handshake and a replayed proof are each
// refused before anything is served, counted (EngineStats::auth_failures, the Prometheus text),
// and the engine keeps serving the peers that hold the secret.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "ferry/engine.h"
#include "ferry/metrics.h"
#include "testing/loopback.h"
#include "testing/ucx_local.h"
#include "transport/ucx/door_wire.h"

namespace ferry {
namespace {

using Local = testing::UcxLocal;
using namespace std::chrono_literals;

constexpr char kSecret[] = "deployment-secret-0123456789";

Local Make(const std::string& key, const std::string& secret) {
  EngineOptions o;
  o.key = key;
  o.secret = secret;
  o.ucx.connect_timeout = 3s;
  return testing::MakeUcxLocal(4096, o);
}

// A write from `from` into `to`'s region: the status of the whole attempt.
Status WriteTo(Local& from, Local& to) {
  FERRY_RETURN_IF_ERROR(from.engine->AddPeer(to.engine->Describe()));
  FERRY_ASSIGN_OR_RETURN(Session s, from.engine->OpenSession(from.desc, to.desc));
  TransferOptions o;
  o.deadline = 3s;
  return s.Write(0, 0, 4096, o).Wait();
}

uint16_t PortOf(const Engine& e) {
  const std::string a = e.Describe().addresses.front();
  return static_cast<uint16_t>(std::stoi(a.substr(a.rfind(':') + 1)));
}

// One whole handshake frame from `fd` (blocking, within 3 s); empty when the target closed.
std::string ReadFrame(int fd) {
  std::string buf;
  size_t want = internal::ucx::kDoorPrefixBytes;
  while (buf.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 3000) <= 0) return {};
    char c[4096];
    ssize_t n = recv(fd, c, std::min(sizeof(c), want - buf.size()), 0);
    if (n <= 0) return {};
    buf.append(c, static_cast<size_t>(n));
    auto len = internal::ucx::DoorFrameLength(buf);
    if (!len.ok()) return {};
    if (*len != 0) want = *len;
  }
  return buf;
}

void SendAll(int fd, const std::string& frame) {
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
}

TEST(UcxAuth, PeersThatShareTheSecretConnect) {
  Local a = Make("auth-a", kSecret), b = Make("auth-b", kSecret);
  ASSERT_TRUE(a.engine && b.engine);
  EXPECT_TRUE(WriteTo(a, b).ok());
  EXPECT_EQ(b.engine->stats().auth_failures, 0u);
}

TEST(UcxAuth, AWrongOrMissingSecretIsRefusedAndCounted) {
  Local target = Make("auth-t", kSecret);
  Local wrong = Make("auth-w", "another-secret-0123456789");
  Local none = Make("auth-n", "");
  ASSERT_TRUE(target.engine && wrong.engine && none.engine);
  Status w = WriteTo(wrong, target);
  EXPECT_EQ(w.code(), Code::kPermissionDenied) << w.ToString();
  Status n = WriteTo(none, target);
  EXPECT_EQ(n.code(), Code::kPermissionDenied) << n.ToString();
  EXPECT_NE(n.message().find("secret"), std::string::npos) << n.ToString();
  // The wrong secret is found by the initiator first (the target's proof does not check); the
  // target counts its hang-up on its door thread.
  for (auto until = std::chrono::steady_clock::now() + 2s;
       target.engine->stats().auth_failures < 2 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(target.engine->stats().auth_failures, 2u);
  const std::string text = RenderPrometheus(target.engine->Metrics());
  EXPECT_NE(text.find("ferry_auth_failures_total{engine=\"auth-t\"} 2"), std::string::npos) << text;
  // Mutual: an engine with a secret refuses a target that does not authenticate.
  Status back = WriteTo(target, none);
  EXPECT_EQ(back.code(), Code::kPermissionDenied) << back.ToString();
  // The target still serves a peer that holds the secret.
  Local good = Make("auth-g", kSecret);
  ASSERT_TRUE(good.engine);
  EXPECT_TRUE(WriteTo(good, target).ok());
}

TEST(UcxAuth, ARawClientAndAReplayedProofAreRefused) {
  namespace u = internal::ucx;
  Local target = Make("auth-r", kSecret);
  ASSERT_TRUE(target.engine);
  const uint16_t port = PortOf(*target.engine);

  // A hello without a nonce: refused with a welcome that says why, before any endpoint exists.
  u::Hello hello;
  hello.from_key = "raw";
  hello.to_key = "auth-r";
  hello.lanes = 1;
  hello.worker_address = std::string(64, 'w');
  {
    auto [fd, rc] = testing::DialLoopback(port);
    ASSERT_EQ(rc, 0);
    SendAll(fd, u::EncodeHello(hello));
    auto w = u::DecodeWelcome(ReadFrame(fd));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->code, Code::kPermissionDenied);
    close(fd);
  }
  // A client that knows the secret proves it once; a second connection replays that proof
  // against a fresh challenge and is refused.
  hello.nonce = std::string(32, 'n');
  std::string proof;
  {
    auto [fd, rc] = testing::DialLoopback(port);
    ASSERT_EQ(rc, 0);
    SendAll(fd, u::EncodeHello(hello));
    auto c = u::DecodeChallenge(ReadFrame(fd));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->mac, u::TargetProof(kSecret, hello, c->nonce));  // the target holds the secret
    proof = u::EncodeProof(u::Proof{u::InitiatorProof(kSecret, hello, c->nonce)});
    close(fd);  // never sent: the proof is only recorded
  }
  {
    auto [fd, rc] = testing::DialLoopback(port);
    ASSERT_EQ(rc, 0);
    SendAll(fd, u::EncodeHello(hello));
    auto c = u::DecodeChallenge(ReadFrame(fd));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    SendAll(fd, proof);
    auto w = u::DecodeWelcome(ReadFrame(fd));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->code, Code::kPermissionDenied) << w->message;
    close(fd);
  }
  // Garbage in place of a proof.
  {
    auto [fd, rc] = testing::DialLoopback(port);
    ASSERT_EQ(rc, 0);
    SendAll(fd, u::EncodeHello(hello));
    ASSERT_TRUE(u::DecodeChallenge(ReadFrame(fd)).ok());
    SendAll(fd, u::EncodeHello(hello));  // a frame, but not a proof
    auto w = u::DecodeWelcome(ReadFrame(fd));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->code, Code::kPermissionDenied);
    close(fd);
  }
  EXPECT_GE(target.engine->stats().auth_failures, 3u);
  Local good = Make("auth-g2", kSecret);
  ASSERT_TRUE(good.engine);
  EXPECT_TRUE(WriteTo(good, target).ok());
}

TEST(UcxAuth, BadSecretsAreRefusedAtCreate) {
  EngineOptions o;
  o.transports = {"ucx"};
  o.secret = "short";
  EXPECT_EQ(Engine::Create(o).status().code(), Code::kInvalidArgument);
  o.secret.clear();
  o.secret_file = "/nonexistent/ferry-secret";
  EXPECT_EQ(Engine::Create(o).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
