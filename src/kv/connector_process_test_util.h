// Connector workers in child processes, for the two-process fault tests
// (connector_process_test.cc): the test binary starts itself again (optionally through a prefix
// such as `ip netns exec NS`) with FERRY_KV_CHILD_FD set, and the child's KvChild.Serve case
// builds one worker and runs the commands the parent sends, one line each, over a socketpair.
// Children are started by exec, not a bare fork, so no thread of the parent's engines is
// copied into them. A child dies with its parent (PR_SET_PDEATHSIG).
//
// Thread safety: a Child is used by the test's thread only.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kv/connector_test_util.h"
#include "testing/proc_state.h"

extern char** environ;

namespace ferry::kv::testing {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

inline std::string Csv(const std::vector<uint64_t>& v) {
  if (v.empty()) return "-";
  std::string out;
  for (uint64_t x : v) {
    if (!out.empty()) out += ',';
    out += std::to_string(x);
  }
  return out;
}

inline std::vector<uint64_t> ParseCsv(const std::string& s, char sep = ',') {
  std::vector<uint64_t> out;
  if (s == "-" || s.empty()) return out;
  std::istringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(std::stoull(item));
  return out;
}

inline std::string ToHex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

inline std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// Lines over a stream socket; Read waits at most `timeout` (negative: for ever).
struct Lines {
  int fd = -1;
  std::string buffer;
  bool Read(std::string* line, milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    for (;;) {
      size_t nl = buffer.find('\n');
      if (nl != std::string::npos) {
        *line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        return true;
      }
      int wait = -1;
      if (timeout.count() >= 0) {
        wait = static_cast<int>(std::chrono::duration_cast<milliseconds>(until - Clock::now()).count());
        if (wait <= 0) return false;
      }
      pollfd pfd{fd, POLLIN, 0};
      int rc = poll(&pfd, 1, wait);
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) return false;
      char chunk[4096];
      ssize_t n = read(fd, chunk, sizeof(chunk));
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
    }
  }
  bool Write(const std::string& line) {
    std::string l = line + "\n";
    return send(fd, l.data(), l.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(l.size());
  }
};

// A worker of our own making: MakeWorker's, with the engine's ucx listen address (a network
// namespace's own address) when `listen_host` is given.
inline std::unique_ptr<Worker> NewWorker(const std::string& transport, const std::string& instance,
                                         ConnectorOptions options, const std::string& listen_host = "") {
  auto w = std::make_unique<Worker>();
  auto layout = MakeLayout(Identity(0, 1), TensorOrder::kKvFirst);
  if (!layout.ok()) return nullptr;
  w->layout = *layout;
  EngineOptions eo;
  eo.transports = {transport};
  eo.key = instance + "-" + std::to_string(getpid());
  if (!listen_host.empty()) eo.ucx.listen_host = listen_host;
  auto e = Engine::Create(eo);
  if (!e.ok()) return nullptr;
  w->engine = std::move(*e);
  for (uint64_t bytes : w->layout.region_bytes) {
    auto b = AllocateSharedHost(bytes);
    if (!b.ok()) return nullptr;
    auto d = w->engine->RegisterMemory(b->data(), bytes);
    if (!d.ok()) return nullptr;
    w->regions.push_back(*d);
    w->buffers.push_back(std::move(*b));
  }
  options.instance = instance;
  auto c = Connector::Create(w->engine.get(), w->layout, w->regions, options);
  if (!c.ok()) return nullptr;
  w->conn = std::move(*c);
  return w;
}

inline void FillBytes(Worker& w, std::byte v) {
  for (const auto& b : w.buffers) std::memset(b.data(), static_cast<int>(v), b.size());
}
inline uint64_t CountNot(Worker& w, std::byte v) {
  uint64_t n = 0;
  for (const auto& b : w.buffers) {
    for (uint64_t i = 0; i < b.size(); ++i) n += b.data()[i] != v;
  }
  return n;
}
inline uint64_t CheckLayers(Worker& w, uint64_t req, const std::vector<uint64_t>& blocks, uint64_t tokens) {
  uint64_t bad = 0;
  for (uint32_t l = 0; l < w.layout.num_layers; ++l) bad += Check(w, req, l, blocks, tokens);
  return bad;
}

// A request's end as a child reports it: "id/outcome/code/ms-since-mark/blocks" (blocks
// separated by '.').
struct ChildEnd {
  Finished f;
  int64_t ms = 0;
};

inline std::string Status2(const Status& s) { return s.ok() ? "OK" : "ERR " + s.ToString(); }

// One command in the child. `w` is built by "make".
inline std::string Do(const std::string& cmd, std::istringstream& in, std::unique_ptr<Worker>& w,
                      Clock::time_point& mark) {
  if (cmd == "make") {
    std::string transport, instance, mode, host;
    int64_t transfer_ms, abort_ms, liveness_ms;
    in >> transport >> instance >> mode >> transfer_ms >> abort_ms >> liveness_ms >> host;
    ConnectorOptions o;
    o.mode = mode == "r" ? Mode::kRead : Mode::kWrite;
    o.transfer_timeout = milliseconds(transfer_ms);
    o.deferred_write_timeout = milliseconds(transfer_ms);
    o.abort_timeout = milliseconds(abort_ms);
    o.liveness_interval = milliseconds(liveness_ms);
    w = NewWorker(transport, instance, o, host == "-" ? "" : host);
    return w ? "META " + ToHex(w->conn->Metadata()) : "ERR cannot make the worker";
  }
  if (!w) return "ERR no worker";
  std::string id, blocks, hex;
  uint64_t req = 0, tokens = 0;
  if (cmd == "peer") {
    in >> hex;
    return Status2(w->conn->AddPeer(FromHex(hex)));
  }
  if (cmd == "expect") {  // expect ID PRODUCER BLOCKS TOKENS
    std::string producer;
    in >> id >> producer >> blocks >> tokens;
    return Status2(w->conn->ExpectWrite(id, producer, 0, ParseCsv(blocks), tokens));
  }
  if (cmd == "save") {  // save ID REQ FIRST_LAYER END_LAYER BLOCKS TOKENS [seal]: Fill, SaveLayer
    uint32_t first, end;
    std::string seal;
    in >> id >> req >> first >> end >> blocks >> tokens >> seal;
    Status s;
    for (uint32_t l = first; l < end && l < w->layout.num_layers; ++l) {
      Fill(*w, req, l, ParseCsv(blocks), tokens);
      if (Status st = w->conn->SaveLayer(id, l, ParseCsv(blocks)); s.ok()) s = st;
    }
    if (seal == "seal") {
      if (Status st = w->conn->Seal(id, w->layout.num_layers); s.ok()) s = st;
    }
    return Status2(s);
  }
  if (cmd == "hold") {  // hold ID REQ BLOCKS TOKENS: Fill every layer, HoldForRead
    in >> id >> req >> blocks >> tokens;
    for (uint32_t l = 0; l < w->layout.num_layers; ++l) Fill(*w, req, l, ParseCsv(blocks), tokens);
    auto p = w->conn->HoldForRead(id, ParseCsv(blocks), tokens);
    return p.ok() ? "PARAMS " + ToHex(p->Pack()) : Status2(p.status());
  }
  if (cmd == "read") {  // read PARAMS_HEX BLOCKS
    in >> hex >> blocks;
    auto p = ReadParams::Unpack(FromHex(hex));
    if (!p.ok()) return Status2(p.status());
    return Status2(w->conn->StartRead(*p, ParseCsv(blocks)));
  }
  if (cmd == "abort") {
    in >> id;
    return Status2(w->conn->Abort(id));
  }
  if (cmd == "mark") {
    mark = Clock::now();
    return "OK";
  }
  if (cmd == "wait") {  // wait N MS: the requests that end, until N ended or MS passed
    size_t n;
    int64_t ms;
    in >> n >> ms;
    std::string out;
    size_t got = 0;
    const auto until = Clock::now() + milliseconds(ms);
    while (got < n && Clock::now() < until) {
      for (auto& f : w->conn->WaitFinished(milliseconds(5))) {
        std::string b = Csv(f.blocks);
        std::replace(b.begin(), b.end(), ',', '.');
        out += " " + f.request + "/" + std::to_string(static_cast<int>(f.outcome)) + "/" +
               std::to_string(static_cast<int>(f.status.code())) + "/" + std::to_string(MsSince(mark)) + "/" + b;
        ++got;
      }
    }
    return "FIN" + out;
  }
  if (cmd == "check") {  // check REQ BLOCKS TOKENS: words of every layer off the pattern
    in >> req >> blocks >> tokens;
    return "BAD " + std::to_string(CheckLayers(*w, req, ParseCsv(blocks), tokens));
  }
  if (cmd == "fill") {  // fill BYTE: every byte of the cache
    int v;
    in >> v;
    FillBytes(*w, std::byte(v));
    return "OK";
  }
  if (cmd == "verify") {  // verify BYTE: bytes of the cache that differ
    int v;
    in >> v;
    return "DIFF " + std::to_string(CountNot(*w, std::byte(v)));
  }
  if (cmd == "stats") {
    ConnectorStats s = w->conn->stats();
    return "STATS " + std::to_string(w->conn->pending()) + " " + std::to_string(s.blocks_expired) + " " +
           std::to_string(s.peers_lost) + " " + std::to_string(s.layers_written) + " " + std::to_string(s.peers_fenced);
  }
  return "ERR unknown command " + cmd;
}

// The child's loop, until "exit" or the parent goes away.
inline void Serve(int fd) {
  Lines io{fd, {}};
  std::unique_ptr<Worker> w;
  Clock::time_point mark = Clock::now();
  std::string line;
  while (io.Read(&line, milliseconds(-1))) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "exit") break;
    if (!io.Write(Do(cmd, in, w, mark))) break;
  }
  (void)io.Write("BYE");
}

// The parent's handle of a child.
class Child {
 public:
  // REQUIRES: no thread of this process holds a lock the child would need (exec replaces it).
  static std::unique_ptr<Child> Start(std::vector<std::string> prefix = {}, std::vector<std::string> env = {}) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
    // The child's end must not already be fd 3: dup2 onto itself would leave it close-on-exec.
    int child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    close(sv[1]);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_end, 3);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);  // gtest's lines
    std::vector<std::string> argv_s = prefix;
    argv_s.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
    argv_s.push_back("--gtest_filter=KvChild.Serve");
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    env.push_back("FERRY_KV_CHILD_FD=3");
    for (char** e = environ; *e != nullptr; ++e) {
      if (strncmp(*e, "GTEST_", 6) != 0 && strncmp(*e, "FERRY_KV_CHILD_FD=", 18) != 0) env.push_back(*e);
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    auto c = std::unique_ptr<Child>(new Child());
    int rc = posix_spawnp(&c->pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(child_end);
    c->io_.fd = sv[0];
    if (rc != 0) c->pid_ = -1;
    return rc == 0 ? std::move(c) : nullptr;
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(io_.fd);
  }
  // One command and its answer ("" when none came within `timeout`).
  std::string Call(const std::string& line, milliseconds timeout = milliseconds(10000)) {
    Post(line);
    std::string reply;
    return io_.Read(&reply, timeout) ? reply : "";
  }
  // A command whose answer is read later (Answer), e.g. one sent to a stopped child.
  void Post(const std::string& line) { (void)io_.Write(line); }
  std::string Answer(milliseconds timeout = milliseconds(10000)) {
    std::string reply;
    return io_.Read(&reply, timeout) ? reply : "";
  }
  // The worker's packed metadata, or "" (with a test failure).
  std::string Make(const std::string& args) {
    std::string r = Call("make " + args, milliseconds(30000));
    EXPECT_EQ(r.rfind("META ", 0), 0u) << r;
    return r.rfind("META ", 0) == 0 ? FromHex(r.substr(5)) : "";
  }
  // "wait": the ends reported.
  std::vector<ChildEnd> Wait(size_t n, milliseconds within) {
    std::string r = Call("wait " + std::to_string(n) + " " + std::to_string(within.count()), within + milliseconds(10000));
    std::vector<ChildEnd> out;
    std::istringstream in(r);
    std::string tok;
    in >> tok;
    EXPECT_EQ(tok, "FIN") << r;
    while (in >> tok) {
      std::vector<std::string> parts;
      std::istringstream t(tok);
      std::string p;
      while (std::getline(t, p, '/')) parts.push_back(p);
      if (parts.size() < 4) continue;
      ChildEnd e;
      e.f.request = parts[0];
      e.f.outcome = static_cast<Outcome>(std::stoi(parts[1]));
      e.f.status = Status(static_cast<Code>(std::stoi(parts[2])), "");
      e.ms = std::stoll(parts[3]);
      if (parts.size() > 4) e.f.blocks = ParseCsv(parts[4], '.');
      out.push_back(std::move(e));
    }
    return out;
  }
  void Signal(int sig) { kill(pid_, sig); }
  // Waits (bounded) until the child is stopped: SIGSTOP is delivered asynchronously.
  bool WaitStopped() { return ::ferry::testing::WaitProcessStopped(pid_, 2000); }
  pid_t pid() const { return pid_; }

 private:
  Child() = default;
  pid_t pid_ = -1;
  Lines io_;
};

}  // namespace ferry::kv::testing
