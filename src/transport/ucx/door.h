// The `ucx` transport's front door: ferry's own TCP listener, where an initiator shows it is a
// ferry engine (door_wire.h) before any UCX endpoint is made. UCX's sockaddr connection manager
// is not used: in UCX 1.13 it aborts the process on some malformed bytes from a peer
// (tcp_sockcm_ep.c), and it takes every connection for ever. Here a connection must send a
// valid hello within the handshake timeout; at most max_pending handshakes are in progress (the
// oldest is dropped for a new one) and at most max_connections are established (more are
// refused with kResourceExhausted). An established connection keeps its TCP socket open as
// its control channel: when the initiator closes it, or its process dies, the target forgets
// the connection (GoneFn). Accept failures for want of descriptors pause accepting briefly
// instead of spinning.
//
// Threads: one door thread per engine runs the poll loop and the callbacks. Forget() and
// Stop() may be called from any other thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/deadline.h"
#include "base/mutex.h"
#include "ferry/status.h"
#include "transport/ucx/door_wire.h"

namespace ferry::internal::ucx {

struct DoorOptions {
  std::string host = "127.0.0.1";  // IPv4; "0.0.0.0" = every interface
  uint16_t port = 0;               // 0 = any free port
  std::string key;                 // this engine's key: hellos for another are refused
  size_t max_pending = 64;
  size_t max_connections = 512;
  std::chrono::milliseconds handshake_timeout{5000};
  // Non-empty: a hello must carry a nonce, and the initiator must prove that it holds this
  // secret (door_wire.h, base/auth.h) before it is admitted.
  std::string secret;
};

class Door {
 public:
  // Admits a valid hello for this engine: returns the welcome to send (OK with a connection
  // id, or a refusal). Runs on the door thread; may block until `deadline`.
  using AdmitFn = std::function<Welcome(const Hello&, Deadline)>;
  // The connection `conn_id` ended (its socket closed, or the welcome could not be sent).
  using GoneFn = std::function<void(uint64_t conn_id)>;

  static Result<std::unique_ptr<Door>> Create(const DoorOptions& options, AdmitFn admit, GoneFn gone);
  ~Door();  // Stop()

  uint16_t port() const { return port_; }
  // Closes the control socket of `conn_id` (its connection was dropped elsewhere); GoneFn is
  // not called for it.
  void Forget(uint64_t conn_id) EXCLUDES(mu_);
  // Closes the listener and every socket and joins the door thread. Idempotent.
  void Stop() EXCLUDES(mu_);

  // Connections closed without becoming established: malformed, silent past the timeout,
  // evicted, refused.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  size_t pending() const { return pending_count_.load(std::memory_order_relaxed); }
  size_t established() const { return established_count_.load(std::memory_order_relaxed); }
  // Handshakes refused for want of a valid proof of the secret (counted in refused() too).
  uint64_t auth_failures() const { return auth_failures_.load(std::memory_order_relaxed); }
  // Connections refused for want of room: a hello past max_connections, and handshakes dropped
  // past max_pending (counted in refused() too). EngineStats::connections_refused.
  uint64_t limited() const { return limited_.load(std::memory_order_relaxed); }

 private:
  struct Pending {
    int fd;
    Clock::time_point deadline;
    std::string buf;
    // After the challenge went out: the hello it answered, and the nonce it carried.
    bool challenged = false;
    Hello hello;
    std::string target_nonce;
  };
  struct Established {
    int fd;
    uint64_t conn_id;
  };
  Door(DoorOptions options, AdmitFn admit, GoneFn gone, int listen_fd, int wake_fd, uint16_t port);
  void Loop() EXCLUDES(mu_);
  void Accept();
  void Read(Pending& p, bool* done);  // *done: p is finished (established or closed)
  bool Finish(Pending& p);  // whether p is finished
  void Answer(Pending& p, const Hello& hello);
  void Refuse(int fd, const char* why);
  // Refuses with a welcome that says why (the initiator can report it), counted as an
  // authentication failure and logged once per peer address.
  void RefuseAuth(int fd, const std::string& why);

  const DoorOptions options_;
  const AdmitFn admit_;
  const GoneFn gone_;
  int listen_fd_;  // closed by Stop
  const int wake_fd_;  // eventfd
  const uint16_t port_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<size_t> pending_count_{0};
  std::atomic<size_t> established_count_{0};
  std::atomic<uint64_t> auth_failures_{0};
  std::atomic<uint64_t> limited_{0};

  // Door thread only.
  std::vector<Pending> pending_;
  std::vector<Established> established_;
  Clock::time_point paused_until_{};
  uint64_t accept_errors_ = 0;
  std::set<std::string> auth_logged_;  // peer addresses whose failed authentication was logged

  Mutex mu_;
  std::vector<uint64_t> forget_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
};

// An initiator's side of the handshake: connects to `address` ("ip:port"), sends `hello` and
// waits for the welcome until `deadline`. kUnavailable when nothing answers in time or the
// connection closes; kInvalidArgument when what answers is not a ferry engine; the target's own
// code when it refuses. On success `control` is the open control socket: closing it ends the
// connection at the target.
struct Dialed {
  Welcome welcome;
  int control = -1;
};
// With a `secret`, the hello carries a nonce, the target must prove that it holds the secret
// (a challenge), and the initiator answers with its own proof; a target that does not
// authenticate, or proves wrong, is refused with kPermissionDenied. Without one, a target that
// challenges is refused the same way.
Result<Dialed> Dial(const std::string& address, Hello hello, Deadline deadline, std::string_view secret = {});

}  // namespace ferry::internal::ucx
