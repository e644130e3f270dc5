// Link: a session from a local buffer to a remote buffer, with whatever keeps both alive.
//
// `ferry bench` measures a Link without knowing how it was made. Today the only kind is
// in-process (two engines of this process, each with a buffer); a two-process mode
// (`--listen` on one side, `--peer` on the other) adds a Link whose remote buffer and engine
// live in another process, reached through descriptors exchanged over a side channel.
//
// Thread safety: session() may be used from any thread (Session is thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ferry/engine.h"

namespace ferry::tools {

class Link {
 public:
  virtual ~Link() = default;
  virtual const Session& session() const = 0;
  // Bytes usable at the same offsets on both sides.
  virtual uint64_t bytes() const = 0;
  // One line for humans: "in-process, host -> host, local (direct), 2 copy threads".
  virtual std::string Describe() const = 0;
};

struct InProcessLinkOptions {
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;  // CUDA ordinal when kind is kCuda
  uint64_t bytes = 0;
  EngineOptions engine;  // for both engines; keys are set here
};

// Two engines, a buffer registered in each, the first adding the second as a peer and opening
// a session from its buffer to the other's.
Result<std::unique_ptr<Link>> MakeInProcessLink(const InProcessLinkOptions& options);

}  // namespace ferry::tools
