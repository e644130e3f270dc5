// Helpers shared by the engine tests: a pair of connected engines with registered buffers.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "ferry/engine.h"
#include "ferry/shared_memory.h"

namespace ferry::testing {

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(rng());
  return out;
}

// Where test buffers live: the heap, or shareable host memory (ferry::AllocateSharedHost) that
// the `shm` transport reaches.
enum class HostAlloc : uint8_t { kHeap, kShared };

// A vector allocator over either; the choice travels with the vector (copies, moves, swaps).
template <typename T>
struct TestAllocator {
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  HostAlloc alloc = HostAlloc::kHeap;

  TestAllocator() = default;
  explicit TestAllocator(HostAlloc a) : alloc(a) {}
  template <typename U>
  TestAllocator(const TestAllocator<U>& other) : alloc(other.alloc) {}

  T* allocate(size_t n) {
    if (alloc == HostAlloc::kHeap || n == 0) return std::allocator<T>().allocate(n);
    auto b = AllocateSharedHost(n * sizeof(T));
    if (!b.ok()) throw std::bad_alloc();
    T* p = reinterpret_cast<T*>(b->data());
    std::lock_guard<std::mutex> lock(SharedMu());
    Shared().emplace(p, std::move(b).value());
    return p;
  }
  void deallocate(T* p, size_t n) {
    if (alloc == HostAlloc::kHeap || n == 0) return std::allocator<T>().deallocate(p, n);
    HostBuffer gone;
    std::lock_guard<std::mutex> lock(SharedMu());
    auto it = Shared().find(p);
    if (it == Shared().end()) return;
    gone = std::move(it->second);
    Shared().erase(it);
  }
  friend bool operator==(const TestAllocator& a, const TestAllocator& b) { return a.alloc == b.alloc; }

 private:
  static std::mutex& SharedMu() {
    static std::mutex mu;
    return mu;
  }
  static std::map<const void*, HostBuffer>& Shared() {
    static auto* m = new std::map<const void*, HostBuffer>();
    return *m;
  }
};

using Bytes = std::vector<uint8_t, TestAllocator<uint8_t>>;

inline const char* HostAllocName(HostAlloc a) { return a == HostAlloc::kShared ? "shared" : "heap"; }

// Overwrites `buf` in place (a registered buffer must keep its address).
template <typename Vector>
inline void Fill(Vector& buf, uint64_t seed) {
  auto bytes = RandomBytes(buf.size(), seed);
  std::memcpy(buf.data(), bytes.data(), buf.size());
}

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
