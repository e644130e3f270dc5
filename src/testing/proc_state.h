// Reading a child process's scheduler state from /proc, for tests that stop peers.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace ferry::testing {

// Waits (up to about `tries` ms) until process `pid` is stopped: SIGSTOP is delivered
// asynchronously. False when it never stops or is gone.
inline bool WaitProcessStopped(pid_t pid, int tries = 2000) {
  for (int i = 0; i < tries; ++i) {
    FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    if (f == nullptr) return false;
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    // "pid (comm) S ...": the state follows the last ')' (comm may hold parentheses).
    const char* paren = std::strrchr(buf, ')');
    if (n > 0 && paren != nullptr && paren[1] == ' ' && paren[2] == 'T') return true;
    usleep(1000);
  }
  return false;
}

}  // namespace ferry::testing
