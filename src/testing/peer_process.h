// PeerProcess: a ferry_test_peer child process for multi-process tests (see test_peer.cc), and
// helpers of its command protocol (descriptors in hex, waiting for its notifications).
#pragma once

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/descriptors.h"
#include "testing/proc_state.h"

extern char** environ;

namespace ferry::testing {

class PeerProcess {
 public:
  // Starts the peer with a buffer of `bytes`; null (with a test failure) if it does not come up.
  // `prefix` runs the peer through another command (e.g. `ip netns exec NS`).
  static std::unique_ptr<PeerProcess> Start(uint64_t bytes, std::vector<std::string> args = {},
                                            std::vector<std::string> prefix = {}) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return nullptr;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<std::string> argv_s = prefix;
    argv_s.push_back(FERRY_TEST_PEER);
    argv_s.push_back(std::to_string(bytes));
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    auto p = std::unique_ptr<PeerProcess>(new PeerProcess());
    int rc = posix_spawnp(&p->pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    p->to_ = in[1];
    p->from_ = out[0];
    if (rc != 0) return nullptr;
    auto engine = p->ReadLine(std::chrono::seconds(20));
    auto memory = p->ReadLine(std::chrono::seconds(5));
    auto ready = p->ReadLine(std::chrono::seconds(5));
    if (engine.rfind("ENGINE ", 0) != 0 || memory.rfind("MEMORY ", 0) != 0 || ready != "READY")
      return nullptr;
    auto e = EngineDesc::Unpack(Unhex(engine.substr(7)));
    auto m = MemoryDesc::Unpack(Unhex(memory.substr(7)));
    if (!e.ok() || !m.ok()) return nullptr;
    p->engine = *e;
    p->memory = *m;
    return p;
  }

  ~PeerProcess() {
    Kill(SIGKILL);
    close(to_);
    close(from_);
  }

  // Sends one command line and returns the peer's one-line answer ("" on timeout or exit).
  std::string Command(const std::string& line) {
    std::string l = line + "\n";
    if (write(to_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) return "";
    return ReadLine(std::chrono::seconds(120));  // sanitizer builds of the peer are slow
  }

  // Sends one command line without waiting for an answer.
  void Post(const std::string& line) {
    std::string l = line + "\n";
    (void)!write(to_, l.data(), l.size());
  }

  // The child's "notes" once they read `want` (one-way notifications land a moment after
  // Notify returns), or what they read after 5 s.
  std::string WaitNotes(const std::string& want) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    std::string notes;
    while ((notes = Command("notes")) != want && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return notes;
  }
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Waits until the process is stopped (SIGSTOP is delivered asynchronously).
  bool WaitStopped() { return WaitProcessStopped(pid_, 1000); }
  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  EngineDesc engine;
  MemoryDesc memory;

 private:
  PeerProcess() = default;

  static std::string Unhex(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return out;
  }

  std::string ReadLine(std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd pfd{from_, POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return "";
      char chunk[4096];
      ssize_t n = read(from_, chunk, sizeof(chunk));
      if (n <= 0) return "";
      buffer_.append(chunk, n);
    }
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffer_;
};

// `bytes` in hex, as ferry_test_peer's "peer" and "open" commands take descriptors.
inline std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

inline uint64_t Fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace ferry::testing
