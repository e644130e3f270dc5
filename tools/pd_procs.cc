#include "pd_procs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace ferry::tools::pd {

Result<ChildProcess> SpawnWorker() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return Status(Code::kResourceExhausted, std::string("socketpair: ") + std::strerror(errno));
  const pid_t parent = getpid();
  std::fflush(stdout);  // a child must not print what the router buffered
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return Status(Code::kResourceExhausted, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the router died before prctl took effect
    if (sv[1] == 3) {
      (void)fcntl(3, F_SETFD, 0);
    } else if (dup2(sv[1], 3) < 0) {
      _exit(127);
    }
    (void)dup2(2, 1);
    execl("/proc/self/exe", "ferry", "pd-worker", "--fd", "3", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(sv[1]);
  ChildProcess child;
  child.pid = pid;
  child.channel = std::make_unique<LineChannel>(sv[0]);
  return child;
}

void Stopper::Stop(pid_t pid, std::chrono::milliseconds stop) {
  if (pid <= 0 || kill(pid, SIGSTOP) != 0) return;
  pid_ = pid;
  until_ = std::chrono::steady_clock::now() + stop;
  until_run_ends_ = stop.count() == 0;
}

void Stopper::Tick(bool run_ends) {
  if (pid_ <= 0) return;
  if (!run_ends && (until_run_ends_ || std::chrono::steady_clock::now() < until_)) return;
  std::fprintf(stderr, "ferry pd: continuing the stopped worker (pid %d)\n", static_cast<int>(pid_));
  (void)kill(pid_, SIGCONT);
  pid_ = -1;
}

bool Exited(pid_t pid) {
  if (pid <= 0) return true;
  int status = 0;
  const pid_t r = waitpid(pid, &status, WNOHANG);
  return r == pid || (r < 0 && errno == ECHILD);
}

void Reap(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!Exited(pid)) {
    if (std::chrono::steady_clock::now() >= until) {
      (void)kill(pid, SIGKILL);
      int status = 0;
      (void)waitpid(pid, &status, 0);  // SIGKILL cannot be ignored: this returns
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace ferry::tools::pd
