// Test workers for the KV connector: an engine with its cache in shareable host memory, the
// layout, and a Connector; the KV pattern keyed by logical coordinates (request, layer, K/V,
// token, model head), written and checked through a naive offset formula of its own.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/engine.h"
#include "ferry/kv.h"
#include "ferry/shared_memory.h"

namespace ferry::kv::testing {

using namespace std::chrono_literals;

struct Worker {
  std::vector<HostBuffer> buffers;  // destroyed after the engine (declared first)
  std::unique_ptr<Engine> engine;
  CacheLayout layout;
  std::unique_ptr<Connector> conn;
  std::vector<MemoryDesc> regions;
};

inline CacheLayout Identity(uint32_t tp_rank, uint32_t tp_size, uint32_t block_tokens = 16, bool mla = false,
                            uint32_t heads = 4, uint32_t layers = 3, uint64_t blocks = 64) {
  CacheLayout l;
  l.model = mla ? "test-mla" : "test-model";
  l.dtype_bytes = 2;
  l.head_dim = mla ? 12 : 8;
  l.total_kv_heads = mla ? 1 : heads;
  l.mla = mla;
  l.num_layers = layers;
  l.tp_rank = tp_rank;
  l.tp_size = tp_size;
  l.block_tokens = block_tokens;
  l.num_blocks = blocks;
  return l;
}

inline std::unique_ptr<Worker> MakeWorker(const std::string& transport, const std::string& instance,
                                          CacheLayout identity, TensorOrder order, ConnectorOptions options = {},
                                          bool one_region = false) {
  static std::atomic<int> counter{0};
  auto w = std::make_unique<Worker>();
  auto layout = MakeLayout(identity, order, one_region);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  if (!layout.ok()) return nullptr;
  w->layout = *layout;
  EngineOptions eo;
  eo.transports = {transport};
  eo.key = instance + "-tp" + std::to_string(identity.tp_rank) + "-" + std::to_string(counter.fetch_add(1));
  auto e = Engine::Create(eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  w->engine = std::move(*e);
  for (uint64_t bytes : w->layout.region_bytes) {
    auto b = AllocateSharedHost(bytes);
    EXPECT_TRUE(b.ok());
    if (!b.ok()) return nullptr;
    auto d = w->engine->RegisterMemory(b->data(), bytes);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (!d.ok()) return nullptr;
    w->regions.push_back(*d);
    w->buffers.push_back(std::move(*b));
  }
  options.instance = instance;
  auto c = Connector::Create(w->engine.get(), w->layout, w->regions, options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  w->conn = std::move(*c);
  return w;
}

// Every worker learns every other (both directions), as through the handshake.
inline void Introduce(const std::vector<Worker*>& workers) {
  for (Worker* a : workers) {
    for (Worker* b : workers) {
      if (a != b) {
        ASSERT_TRUE(a->conn->AddPeer(b->conn->Metadata()).ok());
      }
    }
  }
}

inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

inline uint64_t PatternWord(uint64_t req, uint32_t layer, int kv, uint64_t token, uint32_t head, uint64_t word) {
  return Mix(req * 0x9e3779b97f4a7c15ULL + Mix((uint64_t{layer} << 40) ^ (uint64_t(kv) << 39) ^ (token << 16) ^
                                              (uint64_t{head} << 8) ^ word));
}

// Byte offset of (token, model head, K/V, layer) in `l`, for blocks holding tokens from 0 on.
inline std::byte* Locate(Worker& w, const std::vector<uint64_t>& blocks, uint64_t token, uint32_t head, int kv,
                         uint32_t layer) {
  const CacheLayout& l = w.layout;
  const TensorLayout& t = kv ? *l.layers[layer].v : l.layers[layer].k;
  const uint64_t kb = l.kernel_block();
  const uint64_t b = blocks[token / l.block_tokens];
  const uint64_t in = token % l.block_tokens;
  const uint64_t kblock = b * (l.block_tokens / kb) + in / kb;
  const uint64_t local_head = l.mla ? 0 : head - l.first_head();
  return w.buffers[t.region].data() + t.offset + kblock * t.block_stride + (in % kb) * t.token_stride +
         local_head * t.head_stride;
}

// Writes the pattern of every token of `layer` (the heads this worker holds) into `blocks`,
// tokens numbered from `first_token`.
inline void Fill(Worker& w, uint64_t req, uint32_t layer, const std::vector<uint64_t>& blocks, uint64_t tokens,
                 uint64_t first_token = 0) {
  const CacheLayout& l = w.layout;
  for (uint64_t t = 0; t < tokens; ++t) {
    for (uint32_t h = l.first_head(); h < l.first_head() + l.heads(); ++h) {
      for (int kv = 0; kv < (l.mla ? 1 : 2); ++kv) {
        std::byte* p = Locate(w, blocks, t, h, kv, layer);
        for (uint64_t i = 0; i < l.head_bytes() / 8; ++i) {
          uint64_t v = PatternWord(req, layer, kv, t + first_token, l.mla ? 0 : h, i);
          std::memcpy(p + i * 8, &v, 8);
        }
      }
    }
  }
}

// Counts the 8-byte words of `layer` in `blocks` that differ from the pattern.
inline uint64_t Check(Worker& w, uint64_t req, uint32_t layer, const std::vector<uint64_t>& blocks, uint64_t tokens,
                      uint64_t first_token = 0) {
  const CacheLayout& l = w.layout;
  uint64_t bad = 0;
  for (uint64_t t = 0; t < tokens; ++t) {
    for (uint32_t h = l.first_head(); h < l.first_head() + l.heads(); ++h) {
      for (int kv = 0; kv < (l.mla ? 1 : 2); ++kv) {
        const std::byte* p = Locate(w, blocks, t, h, kv, layer);
        for (uint64_t i = 0; i < l.head_bytes() / 8; ++i) {
          uint64_t v;
          std::memcpy(&v, p + i * 8, 8);
          bad += v != PatternWord(req, layer, kv, t + first_token, l.mla ? 0 : h, i);
        }
      }
    }
  }
  return bad;
}

// Collects finished requests from `w` until `n` arrived or `timeout` passed.
inline std::vector<Finished> Collect(Worker& w, size_t n, std::chrono::milliseconds timeout = 10s) {
  std::vector<Finished> out;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (out.size() < n && std::chrono::steady_clock::now() < until) {
    for (auto& f : w.conn->WaitFinished(20ms)) out.push_back(std::move(f));
  }
  return out;
}

inline std::vector<uint64_t> Blocks(std::initializer_list<uint64_t> ids) { return ids; }

}  // namespace ferry::kv::testing
