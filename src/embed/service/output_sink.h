// OutputSink: one registered client's per-layer output buffers and flag words, as the service
// writes them. HostSink writes into the client's outputs memfd (CPU-only mode); the CUDA sink
// (cuda_sink.h) copies pinned staging into device memory opened through CUDA IPC.
//
// Slots are the client's layers in registration order. Write() may be called concurrently for
// disjoint ranges of one slot (gather chunks finish on several threads); Finish() makes every
// earlier Write() of the slot visible before the flag it then sets; Signal() alone (no data)
// is used for failures; WaitFinished() waits until the flags Finish() set are visible to the
// client (at once for host memory). REQUIRES of every call: slot < slots(); ranges inside the
// registered buffer, which the service checks once at registration (max_tokens x token_bytes).
//
// Thread safety: as above; distinct slots may be used from distinct threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "embed/service/host_flag.h"
#include "embed/service/shared_memory.h"
#include "ferry/status.h"

namespace ferry::embed::service {

class OutputSink {
 public:
  virtual ~OutputSink() = default;
  virtual size_t slots() const = 0;
  // Copies `bytes` bytes of host memory `src` to offset `offset` of the slot's output.
  virtual Status Write(size_t slot, uint64_t offset, const uint8_t* src, uint64_t bytes) = 0;
  // After every Write() of the slot is visible to the client, sets its flag to `value`.
  virtual Status Finish(size_t slot, uint32_t value) = 0;
  // Sets the flag now (a failure: no data to order behind).
  virtual Status Signal(size_t slot, uint32_t value) = 0;
  virtual Result<uint32_t> ReadFlag(size_t slot) = 0;
  // Waits until every earlier Write() has read its source (the staging may be reused).
  virtual Status Drain(Deadline deadline) { return Status::Ok(); }
  // True when Write() sources must be page-locked host memory (copies to a GPU).
  virtual bool wants_pinned_source() const { return false; }
  // The slot's output as host memory the service may gather into directly (saving a copy),
  // or null.
  virtual uint8_t* direct(size_t slot) { return nullptr; }
  // Waits until every flag write of earlier Finish() calls completed (CUDA: on the stream).
  virtual Status WaitFinished(Deadline deadline) { return Status::Ok(); }
  // Waits until the slot's last Finish() completed, and with it every Write() of the slot
  // before it (their sources may be reused), without waiting for later slots' work. May run on
  // another thread than Write() and Finish(), once the Finish() it waits for has returned.
  virtual Status WaitSlotFinished(size_t slot, Deadline deadline) { return WaitFinished(deadline); }

  // CUDA sinks only (null / -1 otherwise), for work the service enqueues itself (the UVA
  // kernel): the device, the stream Write() and Finish() use, and the slot's device output.
  virtual int device() const { return -1; }
  virtual void* stream() { return nullptr; }
  virtual uint8_t* device_output(size_t slot) { return nullptr; }
  // Makes the sink's stream wait for an event (cudaEvent_t) before its later work.
  virtual Status WaitEvent(void* event) {
    return Status(Code::kUnsupported, "this output is not CUDA memory");
  }
};

class HostSink final : public OutputSink {
 public:
  // REQUIRES: every output_offsets[i] + buffer_bytes and flag_offsets[i] + 4 inside `memory`,
  // flag offsets 4-byte aligned.
  HostSink(std::shared_ptr<SharedMemory> memory, std::vector<uint64_t> output_offsets,
           std::vector<uint64_t> flag_offsets)
      : memory_(std::move(memory)),
        outputs_(std::move(output_offsets)),
        flags_(std::move(flag_offsets)) {}
  size_t slots() const override { return outputs_.size(); }
  Status Write(size_t slot, uint64_t offset, const uint8_t* src, uint64_t bytes) override;
  Status Finish(size_t slot, uint32_t value) override { return Signal(slot, value); }
  Status Signal(size_t slot, uint32_t value) override {
    StoreFlag(Flag(slot), value);
    return Status::Ok();
  }
  Result<uint32_t> ReadFlag(size_t slot) override { return LoadFlag(Flag(slot)); }
  uint8_t* direct(size_t slot) override { return memory_->data() + outputs_[slot]; }

 private:
  uint32_t* Flag(size_t slot) {
    return reinterpret_cast<uint32_t*>(memory_->data() + flags_[slot]);
  }
  std::shared_ptr<SharedMemory> memory_;
  std::vector<uint64_t> outputs_;
  std::vector<uint64_t> flags_;
};

}  // namespace ferry::embed::service
