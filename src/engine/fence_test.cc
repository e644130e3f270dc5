// Engine::FencePeer: after a consumer fences a producer, the producer's connections to it are
// gone (its sessions report connected() false, their posts fail), a new session works, and
// transports whose peers copy by themselves have nothing to fence.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "ferry/engine.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

struct Side {
  std::vector<uint8_t> buf;  // first: destroyed after the engine
  std::unique_ptr<Engine> engine;
  MemoryDesc desc;
};

Side MakeSide(const std::string& key, const std::string& transport, size_t bytes) {
  Side s;
  EngineOptions options;
  options.key = key;
  options.transports = {transport};
  options.ucx.listen_host = "127.0.0.1";
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return s;
  s.engine = std::move(e).value();
  if (bytes == 0) return s;
  s.buf.assign(bytes, 0);
  auto d = s.engine->RegisterMemory(s.buf.data(), bytes);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (d.ok()) s.desc = *d;
  return s;
}

TEST(FencePeer, UcxDropsThePeersConnectionsAndTheNextSessionWorks) {
  constexpr size_t kBytes = 1 << 20;
  Side a = MakeSide("fa", "ucx", kBytes), b = MakeSide("fb", "ucx", kBytes);
  ASSERT_TRUE(a.engine && b.engine);
  ASSERT_TRUE(a.engine->AddPeer(b.engine->Describe()).ok());
  ASSERT_TRUE(b.engine->AddPeer(a.engine->Describe()).ok());
  for (size_t i = 0; i < kBytes; ++i) a.buf[i] = static_cast<uint8_t>(i * 7 + 1);
  auto old = a.engine->OpenSession(a.desc, b.desc);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  ASSERT_TRUE(old->Write(0, 0, kBytes).Wait().ok());
  EXPECT_TRUE(old->connected());

  ASSERT_TRUE(b.engine->FencePeer("fa", 1s).ok());
  // The producer sees the handshake socket close at its worker's next tick (~20 ms).
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (old->connected() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(old->connected()) << "the fenced engine's session still reports its connection up";
  TransferOptions o;
  o.deadline = 2s;
  Status st = old->Write(0, 0, 4096, o).Wait();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();

  std::fill(b.buf.begin(), b.buf.end(), 0);
  auto fresh = a.engine->OpenSession(a.desc, b.desc);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(fresh->connected());
  ASSERT_TRUE(fresh->Write(0, 0, kBytes).Wait().ok());
  EXPECT_EQ(a.buf, b.buf);
}

TEST(FencePeer, ArgumentsAndPeersWithNothingToFence) {
  Side b = MakeSide("gb", "ucx", 4096);
  ASSERT_TRUE(b.engine);
  EXPECT_EQ(b.engine->FencePeer("nobody", 0s).code(), Code::kInvalidArgument);
  EXPECT_TRUE(b.engine->FencePeer("nobody", 100ms).ok());  // no connection of it: nothing to drop
  Side s = MakeSide("gs", "shm", 0);
  ASSERT_TRUE(s.engine);
  EXPECT_TRUE(s.engine->FencePeer("nobody", 100ms).ok());  // the peer's own copies: nothing queued here
}

}  // namespace
}  // namespace ferry
