// Engine tests' pair: two engines of this process restricted to one transport, each with a
// registered host buffer, and a session from a's buffer to b's. Links ferry_engine.
// Thread safety: EnginePair::Make may be called from any thread; a pair is used by one test.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "ferry/engine.h"
#include "testing/bytes.h"

namespace ferry::testing {

// Two engines restricted to one transport, each with a registered host buffer (on the heap or
// shareable), and a session from a's buffer to b's.
struct EnginePair {
  // Buffers first: they are destroyed after the engines that reach them.
  Bytes a_buf, b_buf;
  std::unique_ptr<Engine> a, b;
  MemoryDesc a_desc, b_desc;
  Session session;

  static std::unique_ptr<EnginePair> Make(const std::string& transport, size_t bytes,
                                          EngineOptions options = {},
                                          HostAlloc alloc = HostAlloc::kHeap) {
    auto p = std::make_unique<EnginePair>();
    static std::atomic<int> counter{0};
    std::string suffix = std::to_string(counter.fetch_add(1));
    options.transports = {transport};
    options.key = "a" + suffix;
    auto a = Engine::Create(options);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) return nullptr;
    options.key = "b" + suffix;
    auto b = Engine::Create(options);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    p->a = std::move(a).value();
    p->b = std::move(b).value();
    p->a_buf = Bytes(bytes, 0, TestAllocator<uint8_t>(alloc));
    p->b_buf = Bytes(bytes, 0, TestAllocator<uint8_t>(alloc));
    auto ad = p->a->RegisterMemory(p->a_buf.data(), bytes);
    auto bd = p->b->RegisterMemory(p->b_buf.data(), bytes);
    EXPECT_TRUE(ad.ok() && bd.ok());
    if (!ad.ok() || !bd.ok()) return nullptr;
    p->a_desc = *ad;
    p->b_desc = *bd;
    // Peers learn each other from packed descriptors, as across a side channel.
    auto b_engine = EngineDesc::Unpack(p->b->Describe().Pack());
    auto a_engine = EngineDesc::Unpack(p->a->Describe().Pack());
    EXPECT_TRUE(p->a->AddPeer(*b_engine).ok());
    EXPECT_TRUE(p->b->AddPeer(*a_engine).ok());
    auto remote = MemoryDesc::Unpack(p->b_desc.Pack());
    auto s = p->a->OpenSession(p->a_desc, *remote);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    p->session = *s;
    return p;
  }
};

}  // namespace ferry::testing
