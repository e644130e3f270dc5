// Authenticated peers over shm (EngineOptions::secret): engines of one host that share the
// secret connect; an initiator without it, or with another, is refused before its hello is
// served, counted in EngineStats::auth_failures, and the target keeps serving.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/engine.h"
#include "ferry/shared_memory.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

struct Side {
  HostBuffer buf;  // first: destroyed after the engine
  std::unique_ptr<Engine> engine;
  MemoryDesc desc;
};

Side Make(const std::string& key, const std::string& secret) {
  Side s;
  EngineOptions o;
  o.key = key;
  o.secret = secret;
  o.transports = {"shm"};
  o.shm.call_timeout = 2s;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return s;
  s.engine = std::move(e).value();
  auto b = AllocateSharedHost(4096);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return s;
  s.buf = std::move(b).value();
  auto d = s.engine->RegisterMemory(s.buf.data(), 4096);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (d.ok()) s.desc = *d;
  return s;
}

Status WriteTo(Side& from, Side& to) {
  FERRY_RETURN_IF_ERROR(from.engine->AddPeer(to.engine->Describe()));
  FERRY_ASSIGN_OR_RETURN(Session s, from.engine->OpenSession(from.desc, to.desc));
  TransferOptions o;
  o.deadline = 2s;
  return s.Write(0, 0, 4096, o).Wait();
}

void WaitForFailures(Engine& e, uint64_t n) {
  for (auto until = std::chrono::steady_clock::now() + 2s; e.stats().auth_failures < n && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(5ms);
}

TEST(ShmAuth, PeersThatShareTheSecretConnectOthersAreRefused) {
  constexpr char kSecret[] = "shm-deployment-secret-0123";
  Side target = Make("shm-t", kSecret), good = Make("shm-g", kSecret);
  Side wrong = Make("shm-w", "another-shm-secret-01234"), none = Make("shm-n", "");
  ASSERT_TRUE(target.engine && good.engine && wrong.engine && none.engine);
  std::memset(good.buf.data(), 0x5a, 4096);
  ASSERT_TRUE(WriteTo(good, target).ok());
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(target.buf.data())[4095], 0x5a);

  Status w = WriteTo(wrong, target);
  EXPECT_EQ(w.code(), Code::kPermissionDenied) << w.ToString();  // the target's proof does not check
  Status n = WriteTo(none, target);
  EXPECT_FALSE(n.ok());
  WaitForFailures(*target.engine, 2);
  EXPECT_EQ(target.engine->stats().auth_failures, 2u);  // the hang-up after a challenge, the hello without a proof
  // Mutual: an engine with a secret refuses a target that does not authenticate.
  Status back = WriteTo(good, none);
  EXPECT_EQ(back.code(), Code::kPermissionDenied) << back.ToString();
  // The target still serves the peer that holds the secret.
  std::memset(good.buf.data(), 0x33, 4096);
  EXPECT_TRUE(WriteTo(good, target).ok());
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(target.buf.data())[0], 0x33);
}

}  // namespace
}  // namespace ferry
