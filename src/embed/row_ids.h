// Row ids of one step: for every token of every request, the G table rows it reads.
//
// Inputs (the shapes vLLM's GPU worker stages for the offload service):
//   tokens           num_tokens int32 ids, the step's tokens of all requests, flattened;
//   query_start_loc  num_reqs + 1 int32, first 0, non-decreasing, last <= num_tokens; request r
//                    owns tokens [qsl[r], qsl[r+1]); tokens at or past qsl[num_reqs] are
//                    padding (speculative-decoding or CUDA-graph padding);
//   ngram_context    num_reqs x (N - 1) int32, row r the N - 1 tokens of request r before this
//                    step, oldest first.
// For request r, x = context[r] ++ tokens[qsl[r]:qsl[r+1]] and token j sits at p = N - 1 + j.
// seg(p) = p - q - 1 with q the last index < p where x[q] == EOS (-1 if none);
// y_s[p] = x[p - s] if p - s >= 0 and seg(p) >= s, else EOS. For n = 2..N,
// mix_n = XOR_{s<n} y_s[p] * m_s, and head h of group n (h in [(n-2)H, (n-1)H)) reads row
// (mix_n mod size_h) + offset_h. Output: row_ids[t * G + h].
//
// Decisions where the specification leaves room (checked by tests/python/test_embed_ids.py):
//  - Negative ids read as 0, in tokens and in the context alike (negative ids are
//    speculative-decoding padding; a context slot before a request's first token may be too).
//  - Context entries may be EOS; an EOS in the context ends the segment just like one in the
//    step (a request that begins this step passes EOS or padding as its context).
//  - An EOS token itself is hashed with the tokens before it (q < p, strictly); only the
//    tokens after it start a new segment.
//  - Only tokens inside requests are validated; padding tokens are never read, and their rows
//    are kPaddingRow (the gather writes zeros for them).
// Errors: kInvalidArgument for wrong buffer sizes, a first query start other than 0 or a
// decreasing one; kOutOfRange for a query start past num_tokens and for an id >= V in a request
// or its context. Nothing is written on error.
//
// Thread safety: ComputeRowIds may run concurrently on distinct outputs; `pool` is only used to
// run tasks and may be shared.
#pragma once

#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "embed/config.h"
#include "ferry/embed.h"
#include "ferry/status.h"

namespace ferry::embed {

// StepInput, kPaddingRow, ValidateStep and ComputeRowIds: ferry/embed.h.

// ComputeRowIds splits steps of at least kParallelTokens tokens into token ranges run on its
// pool (and the calling thread).
inline constexpr int64_t kParallelTokens = 2048;

// The row ids of tokens [begin, end) of a validated step (no checks; used by ComputeRowIds
// and by callers that interleave id computation with gathering).
// REQUIRES: ValidateStep(layout, in).ok(), 0 <= begin <= end <= num_tokens,
//           row_ids.size() == (end - begin) * G.
void RowIdsOfRange(const Layout& layout, const StepInput& in, int64_t begin, int64_t end,
                   uint64_t* row_ids);

}  // namespace ferry::embed
