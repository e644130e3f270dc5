// A hint to the CPU inside a busy-wait loop: lets a sibling hyper-thread run and saves power,
// without giving the core up to the scheduler.
#pragma once

namespace ferry {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ferry
