#include "embed/row_ids.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "embed/parallel.h"

namespace ferry::embed {
namespace {

inline uint64_t Id(int32_t v) { return v < 0 ? 0 : static_cast<uint64_t>(v); }

}  // namespace

Status ValidateStep(const Layout& layout, const StepInput& in) {
  const int64_t n_ctx = layout.ngram_size() - 1;
  const int64_t v = layout.config().vocab_size;
  if (in.query_start_loc.empty())
    return Status(Code::kInvalidArgument, "query_start_loc needs num_reqs + 1 >= 1 entries");
  const int64_t num_reqs = in.num_reqs();
  if (static_cast<int64_t>(in.ngram_context.size()) != num_reqs * n_ctx)
    return Status(Code::kInvalidArgument, "ngram_context has " +
                                              std::to_string(in.ngram_context.size()) + " ids; " +
                                              std::to_string(num_reqs) + " requests x " +
                                              std::to_string(n_ctx) + " expected");
  if (in.query_start_loc[0] != 0)
    return Status(Code::kInvalidArgument,
                  "query_start_loc[0] is " + std::to_string(in.query_start_loc[0]) + ", not 0");
  for (int64_t r = 0; r < num_reqs; ++r) {
    if (in.query_start_loc[r + 1] < in.query_start_loc[r])
      return Status(Code::kInvalidArgument, "query_start_loc decreases at request " +
                                                std::to_string(r) + ": " +
                                                std::to_string(in.query_start_loc[r]) + " > " +
                                                std::to_string(in.query_start_loc[r + 1]));
  }
  const int64_t used = in.query_start_loc[num_reqs];
  if (used > in.num_tokens())
    return Status(Code::kOutOfRange, "query_start_loc ends at " + std::to_string(used) +
                                         ", past the " + std::to_string(in.num_tokens()) +
                                         " tokens");
  for (int64_t t = 0; t < used; ++t) {
    if (in.tokens[t] >= v)
      return Status(Code::kOutOfRange, "token " + std::to_string(t) + " has id " +
                                           std::to_string(in.tokens[t]) +
                                           ", outside the vocabulary of " + std::to_string(v));
  }
  for (size_t i = 0; i < in.ngram_context.size(); ++i) {
    if (in.ngram_context[i] >= v)
      return Status(Code::kOutOfRange, "ngram_context of request " + std::to_string(i / n_ctx) +
                                           " has id " + std::to_string(in.ngram_context[i]) +
                                           ", outside the vocabulary of " + std::to_string(v));
  }
  return Status::Ok();
}

void RowIdsOfRange(const Layout& layout, const StepInput& in, int64_t begin, int64_t end,
                   uint64_t* out) {
  const int n = layout.ngram_size();
  const int heads = layout.num_heads();
  const int per_group = layout.config().heads_per_ngram;
  const uint64_t eos = static_cast<uint64_t>(layout.config().eos_id);
  const uint64_t* m = layout.multipliers().data();
  const uint64_t* offsets = layout.head_offsets().data();
  const FastMod* mods = layout.head_mods().data();
  const int32_t* qsl = in.query_start_loc.data();
  const int64_t num_reqs = in.num_reqs();
  const int32_t* tokens = in.tokens.data();

  // The request of token `begin`: the last r with qsl[r] <= begin (empty requests skipped).
  int64_t r = std::upper_bound(qsl, qsl + num_reqs + 1, begin) - qsl - 1;
  while (r < num_reqs && begin >= qsl[r + 1]) ++r;
  for (int64_t t = begin; t < end; ++t, out += heads) {
    while (r < num_reqs && t >= qsl[r + 1]) ++r;
    if (r >= num_reqs) {  // padding past the last request
      std::fill(out, out + heads, kPaddingRow);
      continue;
    }
    const int64_t i = t - qsl[r];  // index of the token in its request
    const int32_t* ctx = in.ngram_context.data() + r * (n - 1);
    // x[p - s] for p = N - 1 + i: a step token when i >= s, else context[N - 1 + i - s].
    auto x = [&](int s) -> uint64_t { return i >= s ? Id(tokens[t - s]) : Id(ctx[n - 1 + i - s]); };
    uint64_t mix = x(0) * m[0];
    bool blocked = false;  // an EOS among x[p-s+1 .. p-1]: seg(p) < s
    int h = 0;
    for (int s = 1; s < n; ++s) {
      const uint64_t v = x(s);
      const uint64_t y = blocked ? eos : v;
      blocked = blocked || v == eos;
      mix ^= y * m[s];
      for (int k = 0; k < per_group; ++k, ++h) out[h] = mods[h].Mod(mix) + offsets[h];
    }
  }
}

Status ComputeRowIds(const Layout& layout, const StepInput& in, std::span<uint64_t> row_ids,
                     ThreadPool* pool) {
  const int64_t heads = layout.num_heads();
  if (static_cast<int64_t>(row_ids.size()) != in.num_tokens() * heads)
    return Status(Code::kInvalidArgument, "row_ids has " + std::to_string(row_ids.size()) +
                                              " entries; " + std::to_string(in.num_tokens()) +
                                              " tokens x " + std::to_string(heads) +
                                              " heads expected");
  FERRY_RETURN_IF_ERROR(ValidateStep(layout, in));
  const int64_t num_tokens = in.num_tokens();
  if (pool == nullptr || num_tokens < kParallelTokens) {
    RowIdsOfRange(layout, in, 0, num_tokens, row_ids.data());
    return Status::Ok();
  }
  constexpr int64_t kChunk = 512;
  std::atomic<int64_t> cursor{0};
  const int workers =
      static_cast<int>(std::min<int64_t>(pool->size() + 1, (num_tokens + kChunk - 1) / kChunk));
  RunOnWorkers(pool, workers, [&](int) {
    for (;;) {
      int64_t b = cursor.fetch_add(kChunk, std::memory_order_relaxed);
      if (b >= num_tokens) return;
      int64_t e = std::min(num_tokens, b + kChunk);
      RowIdsOfRange(layout, in, b, e, row_ids.data() + b * heads);
    }
  });
  return Status::Ok();
}

}  // namespace ferry::embed
