// OpenCudaSink: the OutputSink of a client whose outputs and flags are device memory, opened
// from the registration's CUDA IPC handles. Rows are copied from the service's host staging
// with asynchronous copies on one stream per client, and each flag is set with a stream
// memory write (cuStreamWriteValue32) ordered after the slot's copies, so DONE is never
// visible before the rows; an event recorded after it lets WaitFinished() time its completion.
// Flags are read back with a copy into a page-locked word. Without CUDA (or without a GPU) it
// reports kUnsupported / kFailedPrecondition; the service then refuses the registration with that
// error.
//
// Thread safety: see OutputSink.
#pragma once

#include <memory>

#include "embed/service/output_sink.h"
#include "embed/service/protocol.h"
#include "ferry/status.h"

namespace ferry::embed::service {

// REQUIRES: reg.mode == OutputMode::kCuda. out_bytes: one slot's output size.
Result<std::unique_ptr<OutputSink>> OpenCudaSink(const Register& reg, uint64_t out_bytes);

}  // namespace ferry::embed::service
