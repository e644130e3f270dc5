#include "observe.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

namespace ferry::tools {
namespace {

// The write end of the live dump's pipe (-1: none), read by the handler.
std::atomic<int> g_pipe{-1};
struct sigaction g_previous;

void OnUsr1(int) {
  const int saved = errno;
  const int fd = g_pipe.load();
  if (fd >= 0) {
    const char c = 1;
    (void)!write(fd, &c, 1);  // non-blocking: a full pipe already has a dump pending
  }
  errno = saved;
}

}  // namespace

Result<std::unique_ptr<InFlightDump>> InFlightDump::Start(const Engine* engine, std::FILE* out) {
  if (g_pipe.load() >= 0) return Status(Code::kFailedPrecondition, "an in-flight dump is already installed");
  std::unique_ptr<InFlightDump> d(new InFlightDump());
  d->engine_ = engine;
  d->out_ = out;
  if (pipe2(d->pipe_, O_CLOEXEC | O_NONBLOCK) != 0)
    return Status(Code::kResourceExhausted, std::string("in-flight dump pipe: ") + strerror(errno));
  // The reading end blocks: the thread sleeps until a signal or the destructor writes.
  fcntl(d->pipe_[0], F_SETFL, 0);
  try {
    d->thread_ = std::thread([p = d.get()] { p->Run(); });
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted, std::string("cannot start the in-flight dump thread: ") + e.what());
  }
  g_pipe.store(d->pipe_[1]);
  struct sigaction sa {};
  sa.sa_handler = &OnUsr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, &g_previous);
  return d;
}

InFlightDump::~InFlightDump() {
  if (thread_.joinable()) {
    sigaction(SIGUSR1, &g_previous, nullptr);
    g_pipe.store(-1);
    const char stop = 0;
    while (write(pipe_[1], &stop, 1) < 0 && errno == EAGAIN) std::this_thread::yield();
    thread_.join();
  }
  for (int fd : pipe_)
    if (fd >= 0) close(fd);
}

void InFlightDump::Run() {
  char c;
  while (true) {
    ssize_t n = read(pipe_[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == 0) return;  // 0: the destructor's stop
    const std::string text = RenderInFlight(engine_->InFlight());
    std::fwrite(text.data(), 1, text.size(), out_);
    std::fflush(out_);
    dumps_.fetch_add(1);
  }
}

void AddMetricsPortOption(CLI::App* command, int* port) {
  command->add_option("--metrics-port", *port,
                      "Serve GET /metrics (Prometheus text) on 127.0.0.1:PORT (0 = off, -1 = any free port)")
      ->check(CLI::Range(-1, 65535));
}

}  // namespace ferry::tools
