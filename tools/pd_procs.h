// The worker processes of `ferry pd`: started by re-executing this binary as
// `ferry pd-worker --fd 3`, with the router's end of a socketpair as the channel. A worker dies
// with the router (PR_SET_PDEATHSIG), so a killed run leaves nothing behind.
//
// Thread safety: none; the router's thread owns them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "ferry/status.h"
#include "pd_channel.h"

namespace ferry::tools::pd {

struct ChildProcess {
  pid_t pid = -1;
  std::unique_ptr<LineChannel> channel;
};

// Starts `ferry pd-worker` (this executable) with a channel to it; its stdout goes to this
// process's stderr, so the router's stdout holds only the summary.
Result<ChildProcess> SpawnWorker();

// --stop-prefill-after: one worker stopped (SIGSTOP) and continued (SIGCONT) after a while, so
// that its peers see a process that lives but answers nothing meanwhile.
class Stopper {
 public:
  // Stops `pid`; Tick() continues it once `stop` passed (zero: only at the run's end).
  void Stop(pid_t pid, std::chrono::milliseconds stop);
  // Continues the stopped worker when its time is up, or now when `run_ends`.
  void Tick(bool run_ends = false);

 private:
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point until_{};
  bool until_run_ends_ = false;
};

// Whether `pid` has exited (reaped here); never blocks.
bool Exited(pid_t pid);
// Waits until `pid` exits, up to `timeout`, then kills it (SIGKILL) and reaps it.
void Reap(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace ferry::tools::pd
