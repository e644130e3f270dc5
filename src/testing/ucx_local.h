// This process's side of the ucx multi-process tests (ucx_process_test.cc, ucx_hostile_test.cc):
// an engine with only the ucx transport and one registered host buffer filled from seed 42.
//
// Thread safety: a value owned by one test; the engine is thread-safe.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ferry/engine.h"
#include "testing/bytes.h"

namespace ferry::testing {

// The buffer is declared first: it is freed after the engine, which may still be sending
// from it (a transfer that hit its deadline) until it shuts down.
struct UcxLocal {
  std::vector<uint8_t> buf;
  std::unique_ptr<Engine> engine;
  MemoryDesc desc;
};

// `options` with its transports set to ucx alone.
inline UcxLocal MakeUcxLocal(size_t bytes, EngineOptions options) {
  UcxLocal l;
  options.transports = {"ucx"};
  auto e = Engine::Create(options);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  l.engine = std::move(e).value();
  l.buf.assign(bytes, 0);
  Fill(l.buf, 42);
  l.desc = *l.engine->RegisterMemory(l.buf.data(), bytes);
  return l;
}

}  // namespace ferry::testing
