// For engine tests below the public API: two EngineCores of this process over the transports a
// test names (often testing/wrapped_transport.h's interposed `local`), a's whole host buffer and
// a region of b's registered, each engine the other's peer, and a session from a's buffer to
// b's region.
//
//   const TransportEntry entries[] = {{"local", &MakeInterposedLocal<Mute>}};
//   auto pair = CorePair::Make(entries, options, std::vector<uint8_t>(4096), std::vector<uint8_t>(4096));
//
// Thread safety: Make may be called from any thread; a pair is used by one test. The engines
// are thread-safe.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine_core.h"

namespace ferry::internal {

struct CorePair {
  std::vector<uint8_t> a_buf, b_buf;
  std::shared_ptr<EngineCore> a, b;
  std::shared_ptr<SessionCore> session;

  // Keys are options.key + "-a<n>" and "-b<n>". b's region is a_buf.size() bytes at `b_at`.
  // Null (with the test failed) when a step fails.
  static std::unique_ptr<CorePair> Make(std::span<const TransportEntry> entries, EngineOptions options,
                                        std::vector<uint8_t> a_buf, std::vector<uint8_t> b_buf, uint64_t b_at = 0) {
    static std::atomic<int> counter{0};
    auto p = std::make_unique<CorePair>();
    p->a_buf = std::move(a_buf);
    p->b_buf = std::move(b_buf);
    const std::string key = options.key, n = std::to_string(counter++);
    options.key = key + "-a" + n;
    auto a = EngineCore::Create(options, entries);
    options.key = key + "-b" + n;
    auto b = EngineCore::Create(options, entries);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return nullptr;
    p->a = *a;
    p->b = *b;
    const size_t region = p->a_buf.size();
    auto ad = p->a->RegisterMemory(p->a_buf.data(), region, MemoryKind::kHost, -1);
    auto bd = p->b->RegisterMemory(p->b_buf.data() + b_at, region, MemoryKind::kHost, -1);
    EXPECT_TRUE(ad.ok() && bd.ok());
    if (!ad.ok() || !bd.ok()) return nullptr;
    EXPECT_TRUE(p->a->AddPeer(p->b->desc()).ok());
    EXPECT_TRUE(p->b->AddPeer(p->a->desc()).ok());
    auto s = p->a->OpenSession(*ad, *bd);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    p->session = *s;
    return p;
  }
  ~CorePair() {
    session.reset();
    if (a) a->Shutdown();
    if (b) b->Shutdown();
  }
};

}  // namespace ferry::internal
