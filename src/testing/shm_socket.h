// The abstract socket name an engine's shm transport listens on, read from its descriptor:
// for tests that reach that socket without an engine (floods, other users).
#pragma once

#include <string>

#include "base/codec.h"
#include "ferry/types.h"

namespace ferry::testing {

// Empty when the engine has no shm transport or its entry does not parse.
inline std::string ShmSocketName(const EngineDesc& engine) {
  const TransportData* t = engine.FindTransport("shm");
  if (t == nullptr) return {};
  auto reader = codec::Reader::Parse(t->data);
  if (!reader.ok()) return {};
  codec::ArrayReader root = reader->root();
  (void)root.Bytes("host", 1024);
  auto name = root.Bytes("socket", 100);
  return name.ok() ? std::string(*name) : std::string();
}

}  // namespace ferry::testing
