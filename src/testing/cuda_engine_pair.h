// The CUDA tests' engine pair: engines a and b of this process (local transport only), a host
// or device buffer registered with each, and a session between them. Links ferry_engine.
// Thread safety: Pair::Make may be called from any thread; a pair is used by one test.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "ferry/engine.h"
#include "testing/cuda_buffer.h"

namespace ferry::cuda_testing {

// Engines a and b (local transport only), a buffer registered with each, and a session from
// a's buffer to b's. Buffers are declared first so that they outlive the engines.
struct Pair {
  std::unique_ptr<Buffer> a_buf, b_buf;
  std::unique_ptr<Engine> a, b;
  MemoryDesc a_desc, b_desc;
  Session session;

  static std::unique_ptr<Pair> Make(Loc a_loc, Loc b_loc, size_t bytes, EngineOptions options = {}) {
    static std::atomic<int> counter{0};
    auto p = std::make_unique<Pair>();
    const std::string suffix = std::to_string(counter.fetch_add(1));
    options.transports = {"local"};
    options.key = "cuda-a" + suffix;
    auto a = Engine::Create(options);
    options.key = "cuda-b" + suffix;
    auto b = Engine::Create(options);
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return nullptr;
    p->a_buf = Buffer::Make(a_loc, bytes);
    p->b_buf = Buffer::Make(b_loc, bytes);
    if (!p->a_buf || !p->b_buf) return nullptr;
    p->a = std::move(a).value();
    p->b = std::move(b).value();
    auto ad = p->a->RegisterMemory(p->a_buf->ptr(), bytes, a_loc.kind, a_loc.device);
    auto bd = p->b->RegisterMemory(p->b_buf->ptr(), bytes, b_loc.kind, b_loc.device);
    EXPECT_TRUE(ad.ok()) << ad.status().ToString();
    EXPECT_TRUE(bd.ok()) << bd.status().ToString();
    if (!ad.ok() || !bd.ok()) return nullptr;
    p->a_desc = *ad;
    p->b_desc = *bd;
    EXPECT_TRUE(p->a->AddPeer(p->b->Describe()).ok());
    EXPECT_TRUE(p->b->AddPeer(p->a->Describe()).ok());
    auto s = p->a->OpenSession(p->a_desc, p->b_desc);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    p->session = *s;
    EXPECT_EQ(p->session.path().transport, "local");
    return p;
  }
};

}  // namespace ferry::cuda_testing
