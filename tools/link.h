// Link: a session from a local buffer to a remote buffer, with whatever keeps both alive.
//
// `ferry bench` measures a Link without knowing how it was made: in-process (two engines of
// this process, each with a buffer), or two-process (`--listen` on one side serves a buffer
// and its engine's descriptors over a side channel; `--peer` on the other fetches them, adds
// the peer and opens the session).
//
// Thread safety: session() may be used from any thread (Session is thread-safe).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "buffers.h"
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
  // One-way notification latency: `count` round trips of a notification answered by the other
  // side, halved. kUnsupported where the other side does not answer (in-process links).
  virtual Result<std::vector<double>> NotificationLatencyUs(int count) const {
    return Status(Code::kUnsupported, "notification latency needs a --peer link");
  }
};

struct InProcessLinkOptions {
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;  // CUDA ordinal when kind is kCuda
  uint64_t bytes = 0;
  HostAlloc alloc = HostAlloc::kHeap;  // of host buffers
  EngineOptions engine;  // for both engines; keys are set here
};

// Two engines, a buffer registered in each, the first adding the second as a peer and opening
// a session from its buffer to the other's.
Result<std::unique_ptr<Link>> MakeInProcessLink(const InProcessLinkOptions& options);

struct RemoteLinkOptions {
  std::string peer;  // side channel of a `ferry bench --listen` process, "host:port"
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;
  uint64_t bytes = 0;  // of the local buffer; the remote one must be at least as large
  HostAlloc alloc = HostAlloc::kHeap;  // of host buffers
  EngineOptions engine;
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  int ping_cpu = -1;  // the CPU the pinging thread keeps during NotificationLatencyUs (-1: any)
};

// A session to the buffer a `ferry bench --listen` process serves.
Result<std::unique_ptr<Link>> MakeRemoteLink(const RemoteLinkOptions& options);

struct ServeOptions {
  std::string listen;  // side channel address, "host:port" (port 0 = any)
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;
  uint64_t bytes = 0;
  HostAlloc alloc = HostAlloc::kHeap;  // of host buffers
  EngineOptions engine;
  std::chrono::milliseconds wait = std::chrono::hours(1);  // for the peer, and for its "done"
  int ping_cpu = -1;  // the CPU the answering thread keeps while it answers pings (-1: any)
};

// Serves a registered buffer to one `ferry bench --peer` run: sends this engine's and the
// buffer's descriptors, then waits until the peer says it is done or goes away.
// `on_listening` receives the side channel's bound address once it listens.
Status ServeBench(const ServeOptions& options,
                  const std::function<void(const std::string&)>& on_listening);

}  // namespace ferry::tools
