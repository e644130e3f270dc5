// ThreadSanitizer annotations for synchronisation TSan cannot see: bytes that travel through
// UCX (shared-memory rings, sockets, another process) order what a thread did before sending
// with what a thread does after receiving. Without TSan the macros compile to nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif

#ifdef FERRY_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
namespace ferry {
// The object that stands for "a message on the wire" in the annotations.
inline char tsan_wire;
}  // namespace ferry
#define FERRY_TSAN_WIRE_RELEASE() __tsan_release(&::ferry::tsan_wire)
#define FERRY_TSAN_WIRE_ACQUIRE() __tsan_acquire(&::ferry::tsan_wire)
#else
#define FERRY_TSAN_WIRE_RELEASE() \
  do {                            \
  } while (0)
#define FERRY_TSAN_WIRE_ACQUIRE() \
  do {                            \
  } while (0)
#endif
