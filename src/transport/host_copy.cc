#include "transport/host_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace ferry::internal {

void StreamingCopy(std::byte* dst, const std::byte* src, size_t n) {
#if defined(__x86_64__)
  if (n < 4096) {
    std::memcpy(dst, src, n);
    return;
  }
  // Head: bring dst to a 16-byte boundary.
  size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  auto* d = reinterpret_cast<__m128i*>(dst);
  auto* s = reinterpret_cast<const __m128i*>(src);
  size_t blocks = n / 64;
  for (size_t i = 0; i < blocks; ++i, d += 4, s += 4) {
    __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(d, s, n - blocks * 64);
#else
  std::memcpy(dst, src, n);
#endif
}

void StreamingFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void CopyInline(std::byte* local, std::byte* remote, std::span<const TransferOp> ops, bool write,
                uint64_t total_bytes) {
  if (total_bytes >= kStreamingCopyBytes) {
    for (const TransferOp& op : ops) {
      if (write) StreamingCopy(remote + op.remote_offset, local + op.local_offset, op.size);
      else StreamingCopy(local + op.local_offset, remote + op.remote_offset, op.size);
    }
    StreamingFence();
    return;
  }
  if (write) {
    for (const TransferOp& op : ops) std::memcpy(remote + op.remote_offset, local + op.local_offset, op.size);
  } else {
    for (const TransferOp& op : ops) std::memcpy(local + op.local_offset, remote + op.remote_offset, op.size);
  }
}

namespace {

// A batch shared by the parts that copy it; part i copies bytes [begin_i, end_i) of the
// concatenation of the ops.
struct Job {
  std::vector<TransferOp> ops;
  std::vector<uint64_t> starts;  // starts[i] = bytes before ops[i]
  std::byte* local;
  std::byte* remote;
  bool write;
  bool streaming;

  // Stops early once the transfer has finished (failed, or its deadline passed): nobody waits
  // for it. Looks every 64 ops and every kCheckBytes, so that one large op (merged runs of
  // blocks are) stops as soon as a small one would.
  void CopyRange(uint64_t begin, uint64_t end, const TransferState& state) const {
    constexpr uint64_t kCheckBytes = 4 << 20;
    size_t i = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
    uint64_t since_check = kCheckBytes;  // look before the first byte
    for (; i < ops.size() && starts[i] < end; ++i) {
      const TransferOp& op = ops[i];
      uint64_t from = std::max(begin, starts[i]) - starts[i];
      const uint64_t to = std::min(end, starts[i] + op.size) - starts[i];
      if ((i & 63) == 0) since_check = kCheckBytes;
      while (from < to) {
        if (since_check >= kCheckBytes) {
          if (state.finished()) {
            if (streaming) StreamingFence();
            return;
          }
          since_check = 0;
        }
        const uint64_t n = std::min(to - from, kCheckBytes - since_check);
        std::byte* l = local + op.local_offset + from;
        std::byte* r = remote + op.remote_offset + from;
        std::byte* dst = write ? r : l;
        const std::byte* src = write ? l : r;
        if (streaming) StreamingCopy(dst, src, n);
        else std::memcpy(dst, src, n);
        from += n;
        since_check += n;
      }
    }
    if (streaming) StreamingFence();  // the stores are visible before the part reports done
  }
};

}  // namespace

void CopyParallel(ThreadPool* pool, std::byte* local, std::byte* remote,
                  std::span<const TransferOp> ops, uint64_t total_bytes, bool write,
                  const std::shared_ptr<TransferState>& state) {
  constexpr uint64_t kMinPartBytes = 256 * 1024;
  auto job = std::make_shared<Job>();
  job->ops.assign(ops.begin(), ops.end());
  job->starts.resize(ops.size());
  uint64_t sum = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    job->starts[i] = sum;
    sum += ops[i].size;
  }
  job->local = local;
  job->remote = remote;
  job->write = write;
  job->streaming = total_bytes >= kStreamingCopyBytes;
  uint64_t parts = std::clamp<uint64_t>(total_bytes / kMinPartBytes, 1, pool->size());
  state->AddParts(static_cast<int>(parts));
  for (uint64_t p = 0; p < parts; ++p) {
    uint64_t begin = total_bytes * p / parts;
    uint64_t end = total_bytes * (p + 1) / parts;
    pool->Submit([job, state, begin, end] {
      job->CopyRange(begin, end, *state);
      state->PartDone(Status::Ok());
    });
  }
}

}  // namespace ferry::internal
