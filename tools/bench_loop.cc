#include "bench_loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

namespace ferry::tools {

std::vector<TransferOp> PlanScatteredOps(uint64_t piece_bytes, uint64_t batch, uint64_t run, uint64_t seed) {
  if (run == 0) run = 1;
  const uint64_t runs = (batch + run - 1) / run;
  std::vector<uint64_t> order(runs);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  // Run r lands at the slots of the runs shuffled before it, so runs stay whole and the last,
  // shorter one fits wherever it falls.
  std::vector<uint64_t> start(runs);
  uint64_t next = 0;
  for (uint64_t r : order) {
    start[r] = next;
    next += std::min(run, batch - r * run);
  }
  std::vector<TransferOp> ops(batch);
  for (uint64_t i = 0; i < batch; ++i)
    ops[i] = {i * piece_bytes, (start[i / run] + i % run) * piece_bytes, piece_bytes};
  return ops;
}

Result<PointResult> MeasurePoint(const Session& session, const PointSpec& spec,
                                 std::span<const TransferOp> ops) {
  using Clock = std::chrono::steady_clock;
  TransferOptions options;
  options.deadline = spec.deadline;
  auto run_one = [&]() -> Status {
    Transfer t = session.Post(spec.op, ops, options);
    return t.Wait();  // bounded by options.deadline
  };
  for (uint64_t i = 0; i < spec.warmup_iters; ++i) {
    Status s = run_one();
    if (!s.ok()) return s.WithContext("warm-up batch");
  }

  PointResult result;
  result.spec = spec;
  const uint64_t batch_bytes =
      std::accumulate(ops.begin(), ops.end(), uint64_t{0},
                      [](uint64_t sum, const TransferOp& o) { return sum + o.size; });
  std::vector<double> latencies_us;
  latencies_us.reserve(std::min<uint64_t>(spec.max_iters, 1 << 16));
  const Clock::time_point start = Clock::now();
  const Clock::time_point min_end = start + spec.min_time;
  Clock::time_point now = start;
  while (result.iters < spec.max_iters && (result.iters < spec.min_iters || now < min_end)) {
    Clock::time_point posted = Clock::now();
    Status s = run_one();
    now = Clock::now();
    if (!s.ok()) return s.WithContext(fmt::format("batch {}", result.iters));
    latencies_us.push_back(std::chrono::duration<double, std::micro>(now - posted).count());
    ++result.iters;
  }
  result.seconds = std::chrono::duration<double>(now - start).count();
  result.bytes = batch_bytes * result.iters;
  result.gbps = GigabytesPerSecond(static_cast<double>(result.bytes), result.seconds);
  result.latency = Summarize(latencies_us);
  return result;
}

double MemcpyBaselineGbps(std::span<const TransferOp> ops, Duration min_time, uint64_t min_iters) {
  using Clock = std::chrono::steady_clock;
  uint64_t src_end = 0, dst_end = 0, batch_bytes = 0;
  for (const TransferOp& o : ops) {
    src_end = std::max(src_end, o.local_offset + o.size);
    dst_end = std::max(dst_end, o.remote_offset + o.size);
    batch_bytes += o.size;
  }
  if (batch_bytes == 0) return 0;
  std::vector<std::byte> src(src_end, std::byte{1}), dst(dst_end, std::byte{0});
  auto copy_batch = [&] {
    for (const TransferOp& o : ops) std::memcpy(dst.data() + o.remote_offset, src.data() + o.local_offset, o.size);
  };
  copy_batch();  // warm-up: the pages are touched once before timing, as the engine's are
  uint64_t iters = 0;
  const Clock::time_point start = Clock::now();
  Clock::time_point now = start;
  while (iters < min_iters || now < start + min_time) {
    copy_batch();
    ++iters;
    now = Clock::now();
  }
  // Keeps the copies from being optimized away.
  volatile std::byte sink = dst[ops.front().remote_offset];
  (void)sink;
  return GigabytesPerSecond(static_cast<double>(batch_bytes * iters), std::chrono::duration<double>(now - start).count());
}

}  // namespace ferry::tools
