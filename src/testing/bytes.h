// Test data below every layer: random bytes from a seed, and byte vectors whose storage is
// the heap or shareable host memory (ferry::AllocateSharedHost) that the `shm` transport reaches.
// Links only ferry_base. Thread safety: TestAllocator may be used from any thread (its table of
// shared buffers is guarded); the rest are pure functions.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "base/mutex.h"
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
    Directory& d = Shared();
    MutexLock lock(&d.mu);
    d.buffers.emplace(p, std::move(b).value());
    return p;
  }
  void deallocate(T* p, size_t n) {
    if (alloc == HostAlloc::kHeap || n == 0) return std::allocator<T>().deallocate(p, n);
    HostBuffer gone;  // freed after the lock is let go
    Directory& d = Shared();
    MutexLock lock(&d.mu);
    auto it = d.buffers.find(p);
    if (it == d.buffers.end()) return;
    gone = std::move(it->second);
    d.buffers.erase(it);
  }
  friend bool operator==(const TestAllocator& a, const TestAllocator& b) { return a.alloc == b.alloc; }

 private:
  // The shareable buffers handed out, by address (one directory for every allocator type).
  struct Directory {
    Mutex mu;
    std::map<const void*, HostBuffer> buffers GUARDED_BY(mu);
  };
  static Directory& Shared() {
    static auto* d = new Directory();  // never destroyed: buffers may be freed at exit
    return *d;
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

}  // namespace ferry::testing
