// UvaGatherer: the UVA mode of the embedding offload. The GPU computes a step's row ids itself
// (bit-exact with ComputeRowIds) and reads the rows straight from the page-locked host table
// into a device buffer, with no CPU work per step.
//
// The table must be one segment and pinned (Table::Pin(), which registers it mapped; ferry
// assumes the device reaches registered memory at its host address, as on 64-bit Linux with
// unified addressing). Inputs are device-visible int32 arrays (device memory or page-locked
// host memory) shaped as in row_ids.h; dst is device memory of num_tokens x E values.
// The kernel checks what it reads: ids >= V and a last query start past num_tokens
// (kOutOfRange), a first query start other than 0 or a decreasing one (kInvalidArgument) are
// recorded on the device and reported by CheckErrors() once the stream has finished; rows it
// could not compute are zeros, and no read leaves the inputs or the table.
// (Unlike ValidateStep, context entries of an empty request are never read, so never checked.)
//
// Thread safety: one UvaGatherer per stream; Enqueue and CheckErrors must not race.
// Launches go to the calling thread's current CUDA device, which must be `device`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/uva_kernels.h"
#include "embed/config.h"
#include "embed/row_ids.h"
#include "ferry/embed.h"
#include "ferry/status.h"

namespace ferry::embed {

struct DeviceStep {
  const int32_t* tokens = nullptr;       // num_tokens
  const int32_t* query_start = nullptr;  // num_reqs + 1
  const int32_t* context = nullptr;      // num_reqs * (N - 1)
  int64_t num_tokens = 0;
  int64_t num_reqs = 0;
};

// The kernel's per-head constants and the fields of its arguments that come from the layout
// and the table (`heads` and `error` are where the kernel finds them). Used by UvaGatherer and
// by the host test of the kernel's logic.
std::vector<cuda::UvaHead> UvaHeads(const Layout& layout);
cuda::UvaStepArgs UvaBaseArgs(const Layout& layout, const Table& table,
                              const cuda::UvaHead* heads, int32_t* error);

class UvaGatherer {
 public:
  // kFailedPrecondition without a GPU or when the table is not pinned; kInvalidArgument when
  // the table is several segments, does not fit the layout, or N > cuda::kUvaMaxNgram.
  static Result<std::unique_ptr<UvaGatherer>> Create(const Layout& layout, const Table& table,
                                                     int device = 0);
  ~UvaGatherer();
  UvaGatherer(const UvaGatherer&) = delete;
  UvaGatherer& operator=(const UvaGatherer&) = delete;

  // Enqueues the step's gather on `stream` (a cudaStream_t; null: the legacy default stream).
  Status Enqueue(const DeviceStep& step, void* dst, void* stream);
  // After the stream has finished: OK, or the first error the kernel recorded since the last
  // call (which clears it).
  Status CheckErrors();
  // For tests and tools: copies host inputs to the device, enqueues on the default stream,
  // waits, and checks errors. dst: device memory.
  Status GatherSync(const StepInput& in, void* dst);

 private:
  UvaGatherer() = default;
  cuda::UvaStepArgs base_{};  // the layout's and table's fields
  int device_ = 0;
  cuda::UvaHead* heads_ = nullptr;  // device memory
  int32_t* error_ = nullptr;  // device memory
};

}  // namespace ferry::embed
