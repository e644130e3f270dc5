// Staged GPU memory over the `ucx` transport: GPU regions (which this UCX build cannot
// register) travel through page-locked host bounce buffers, in chunks, pipelined.
//
// Messages (am_wire.h; their payloads: staged_wire.h):
//   kStagedWrite    payload: a piece table [(target offset, size)...] then the pieces' bytes,
//                   one chunk of at most kStageChunkBytes. The target scatters the chunk into
//                   its region (a GPU region: one CopyEngine batch from a bounce buffer, done
//                   before the ack) and acks.
//   kStagedReadReq  payload: a piece table; `offset` carries the bytes asked for. The target
//                   gathers the pieces (a GPU region: one CopyEngine batch into a bounce
//                   buffer) and answers with one kReadResp of them, concatenated.
// Initiator: a write from GPU memory gathers each chunk into a bounce buffer with one
// CopyEngine batch and sends it as soon as it is there, while later chunks are gathered (at
// most kStageBuffers chunks in flight); a read receives each chunk into a bounce buffer and
// scatters it into the GPU region before the chunk's part completes. Host memory on either
// side is gathered and scattered with memcpy, so a host-only engine reaches GPU peers.
//
// Faults: a connection that fails mid-pipeline fails its chunks' parts with kUnavailable; no
// further chunk is staged, and each bounce buffer returns to its pool once the copy or send
// that used it completed.
//
// Thread safety: Post*/Handle* on the progress thread; PlanChunks is pure.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cuda/copy_engine.h"  // cuda::CopyEngines (no CUDA header)
#include "transport/transport.h"
#include "transport/ucx/am_wire.h"
#include "transport/ucx/staged_wire.h"

namespace ferry::internal::ucx {

class Core;
class Conn;
struct Shard;

inline constexpr size_t kStageBuffers = 8;  // bounce buffers per pool (send, receive)

// One chunk of a batch: the target's pieces, and where each one is in the local region.
struct StageChunk {
  std::vector<StagedPiece> remote;
  std::vector<uint64_t> local_offsets;
  uint64_t bytes = 0;
};

// Splits `ops` into chunks of at most `chunk_bytes` and `max_pieces` pieces, cutting large ops.
std::vector<StageChunk> PlanChunks(std::span<const TransferOp> ops, uint64_t chunk_bytes, size_t max_pieces);

// A copy between GPU memory and a host bounce buffer.
struct StageCopy {
  std::byte* dst;
  const std::byte* src;
  uint64_t size;
};

// How the stager moves bytes between GPU memory and bounce buffers; tests replace it.
class StageCopier {
 public:
  virtual ~StageCopier() = default;  // waits for copies in flight
  // Whether GPU regions of this process can be staged.
  virtual bool gpu() const = 0;
  // Enqueues `copies` on `device` (`pinned`: every host side is a mapped page-locked buffer);
  // `done` runs once, on any thread. An error means nothing was enqueued.
  virtual Status Copy(int device, std::span<const StageCopy> copies, bool pinned,
                      std::function<void(const Status&)> done) = 0;
};
// Copies on `engines`, the engine's cuda::CopyEngines (TransportContext::copy_engines; a set of
// its own when null): one kernel launch per chunk. gpu() is false without CUDA.
std::unique_ptr<StageCopier> MakeCudaStageCopier(std::shared_ptr<cuda::CopyEngines> engines);

class Stager {
 public:
  // `copier`: null for MakeCudaStageCopier on a set of its own.
  Stager(Core* core, std::unique_ptr<StageCopier> copier);
  // GPU copies still in flight finish on their copy engines; their parts then fail with kAborted.
  ~Stager();

  // Whether this engine can stage its own GPU regions (CUDA build with a device).
  bool gpu() const;
  // Bounce buffers (both pools) not in use, and allocated; for tests and diagnostics.
  size_t free_buffers() const;
  size_t allocated_buffers() const;
  // Bytes of heap bounce buffers outstanding (at most kMaxHeapBounceBytes, staged_internal.h),
  // and a smaller bound for tests.
  size_t heap_buffer_bytes() const;
  void SetHeapBufferLimitForTest(size_t bytes);

  // Initiator, progress thread. `local` is acquired by the caller (held by `state`).
  void PostWrite(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Region>& local, const MemoryDesc& remote,
                 std::span<const TransferOp> ops, const std::shared_ptr<TransferState>& state);
  void PostRead(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Region>& local, const MemoryDesc& remote,
                std::span<const TransferOp> ops, const std::shared_ptr<TransferState>& state);

  // Target, progress thread (from Core::OnMessage).
  // `s`: the shard whose progress thread received the request (its answers leave from there).
  void HandleWrite(Shard& s, const AmHeader& h, void* data, size_t length, const ucp_am_recv_param_t* param,
                   bool* keep);
  void HandleReadReq(Shard& s, const AmHeader& h, const void* data, size_t length, const ucp_am_recv_param_t* param);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The ucx transport with `copier` in place of the CUDA one (tests of the staged protocol
// without a GPU); *stager, when given, is set to the transport's stager.
Result<std::unique_ptr<Transport>> MakeUcxTransportWithCopier(const TransportContext& ctx,
                                                              std::unique_ptr<StageCopier> copier,
                                                              Stager** stager = nullptr);

}  // namespace ferry::internal::ucx
