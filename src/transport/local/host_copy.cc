#include "transport/local/host_copy.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ferry::internal {

void CopyInline(std::byte* local, const std::byte* remote_c, std::span<const TransferOp> ops,
                bool write) {
  auto* remote = const_cast<std::byte*>(remote_c);
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

  // Stops early once the transfer has finished (its deadline passed): nobody waits for it.
  void CopyRange(uint64_t begin, uint64_t end, const TransferState& state) const {
    size_t i = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
    for (; i < ops.size() && starts[i] < end; ++i) {
      if ((i & 63) == 0 && state.finished()) return;
      const TransferOp& op = ops[i];
      uint64_t from = std::max(begin, starts[i]) - starts[i];
      uint64_t to = std::min(end, starts[i] + op.size) - starts[i];
      if (to <= from) continue;
      std::byte* l = local + op.local_offset + from;
      std::byte* r = remote + op.remote_offset + from;
      if (write) std::memcpy(r, l, to - from);
      else std::memcpy(l, r, to - from);
    }
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
