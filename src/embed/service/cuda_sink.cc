// OpenCudaSink with CUDA: output buffers and flags opened from the client's IPC handles.
#include "embed/service/cuda_sink.h"

#include <cstring>
#include <map>

#include "base/mutex.h"
#include "cuda/runtime.h"
#include "cuda/stream_ops.h"

namespace ferry::embed::service {
namespace {

constexpr auto kFlagTimeout = std::chrono::seconds(2);

// Bytes from `base` (where an IPC mapping starts) to the end of its allocation, for bounds
// checks.
Result<uint64_t> AllocationBytes(void* base) {
  FERRY_ASSIGN_OR_RETURN(cuda::AllocationRange range, cuda::GetAllocationRange(base));
  const uint64_t skip = static_cast<uint64_t>(static_cast<uint8_t*>(base) -
                                              static_cast<uint8_t*>(range.base));
  return range.size - skip;
}

class CudaSink final : public OutputSink {
 public:
  ~CudaSink() override {
    if (copy_stream_ != nullptr) {
      (void)cuda::SetDevice(device_);
      (void)cuda::StreamSync(copy_stream_, Deadline::After(kFlagTimeout));
      (void)cuda::StreamDestroy(copy_stream_);
    }
    if (done_event_ != nullptr) (void)cuda::EventDestroy(done_event_);
    for (void* e : slot_events_) (void)cuda::EventDestroy(e);
    if (flag_word_ != nullptr) (void)cuda::HostFree(flag_word_);
    if (flag_stream_ != nullptr) (void)cuda::StreamDestroy(flag_stream_);
    if (read_event_ != nullptr) (void)cuda::EventDestroy(read_event_);
    for (auto& [handle, base] : opened_) (void)cuda::IpcCloseHandle(base);
  }

  Status Open(const Register& reg, uint64_t out_bytes) {
    device_ = reg.device;
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    FERRY_ASSIGN_OR_RETURN(copy_stream_, cuda::StreamCreate());
    FERRY_ASSIGN_OR_RETURN(flag_stream_, cuda::StreamCreate());
    FERRY_ASSIGN_OR_RETURN(done_event_, cuda::EventCreate());
    FERRY_ASSIGN_OR_RETURN(read_event_, cuda::EventCreate());
    FERRY_ASSIGN_OR_RETURN(void* word, cuda::HostAlloc(sizeof(uint32_t)));
    flag_word_ = static_cast<uint32_t*>(word);
    for (const LayerOutput& l : reg.layers) {
      // Every offset and size is checked against the allocation the driver mapped.
      FERRY_ASSIGN_OR_RETURN(uint8_t * out, Base(l.output_ipc));
      FERRY_ASSIGN_OR_RETURN(uint8_t * flag, Base(l.flag_ipc));
      FERRY_ASSIGN_OR_RETURN(uint64_t out_alloc, AllocationBytes(out));
      FERRY_ASSIGN_OR_RETURN(uint64_t flag_alloc, AllocationBytes(flag));
      if (l.output_offset > out_alloc || out_bytes > out_alloc - l.output_offset ||
          l.flag_offset > flag_alloc || 4 > flag_alloc - l.flag_offset)
        return Status(Code::kOutOfRange, "layer " + std::to_string(l.layer) +
                                             ": output or flag outside its CUDA allocation");
      FERRY_ASSIGN_OR_RETURN(void* slot_event, cuda::EventCreate());
      slot_events_.push_back(slot_event);
      outputs_.push_back(out + l.output_offset);
      flags_.push_back(reinterpret_cast<uint32_t*>(flag + l.flag_offset));
    }
    out_bytes_ = out_bytes;
    return Status::Ok();
  }

  size_t slots() const override { return outputs_.size(); }
  bool wants_pinned_source() const override { return true; }

  Status Write(size_t slot, uint64_t offset, const uint8_t* src, uint64_t bytes) override {
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));  // the copy pump's thread calls this
    return cuda::MemcpyAsync(outputs_[slot] + offset, src, bytes, copy_stream_);
  }
  Status Finish(size_t slot, uint32_t value) override {
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    FERRY_RETURN_IF_ERROR(cuda::StreamWrite(copy_stream_, flags_[slot], value));
    FERRY_RETURN_IF_ERROR(cuda::EventRecord(slot_events_[slot], copy_stream_));
    return cuda::EventRecord(done_event_, copy_stream_);
  }
  Status WaitFinished(Deadline deadline) override {
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    return cuda::EventSpin(done_event_, deadline);
  }
  Status WaitSlotFinished(size_t slot, Deadline deadline) override {
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    return cuda::EventSpin(slot_events_[slot], deadline);
  }
  int device() const override { return device_; }
  void* stream() override { return copy_stream_; }
  uint8_t* device_output(size_t slot) override { return outputs_[slot]; }
  Status WaitEvent(void* event) override {
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    return cuda::StreamWaitEvent(copy_stream_, event);
  }
  Status Signal(size_t slot, uint32_t value) override {
    MutexLock lock(&flag_mu_);
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    FERRY_RETURN_IF_ERROR(cuda::StreamWrite(flag_stream_, flags_[slot], value));
    return cuda::StreamSync(flag_stream_, Deadline::After(kFlagTimeout));
  }
  // One 4-byte copy into a page-locked word (a true asynchronous copy, no staging through a
  // driver buffer) and a spinning wait for it: the read is on every layer step's path.
  Result<uint32_t> ReadFlag(size_t slot) override {
    MutexLock lock(&flag_mu_);
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    *flag_word_ = kFlagFailed;
    FERRY_RETURN_IF_ERROR(
        cuda::MemcpyAsync(flag_word_, flags_[slot], sizeof(uint32_t), flag_stream_));
    FERRY_RETURN_IF_ERROR(cuda::EventRecord(read_event_, flag_stream_));
    FERRY_RETURN_IF_ERROR(cuda::EventSpin(read_event_, Deadline::After(kFlagTimeout)));
    return LoadFlag(flag_word_);
  }
  Status Drain(Deadline deadline) override {
    FERRY_RETURN_IF_ERROR(cuda::SetDevice(device_));
    return cuda::StreamSync(copy_stream_, deadline);
  }

 private:
  Result<uint8_t*> Base(const std::string& handle) {
    auto it = opened_.find(handle);
    if (it != opened_.end()) return static_cast<uint8_t*>(it->second);
    if (handle.size() != cuda::kIpcHandleBytes)
      return Status(Code::kInvalidArgument, "CUDA IPC handle of the wrong size");
    cuda::IpcHandle h;
    std::memcpy(h.bytes.data(), handle.data(), h.bytes.size());
    FERRY_ASSIGN_OR_RETURN(void* base, cuda::IpcOpenHandle(h, device_));
    opened_[handle] = base;
    return static_cast<uint8_t*>(base);
  }

  int device_ = 0;
  void* done_event_ = nullptr;     // recorded after each Finish()'s flag write
  // One a slot, recorded after its Finish()'s flag write: a pipelined step waits for one
  // layer's copies without waiting for the next layer's.
  std::vector<void*> slot_events_;
  void* read_event_ = nullptr;  // recorded and waited for under flag_mu_
  // Page-locked; set up once, the word it points to read and written under flag_mu_.
  uint32_t* flag_word_ PT_GUARDED_BY(flag_mu_) = nullptr;
  void* copy_stream_ = nullptr;
  void* flag_stream_ = nullptr;
  Mutex flag_mu_;
  std::map<std::string, void*> opened_;  // IPC handle -> mapped base
  std::vector<uint8_t*> outputs_;
  std::vector<uint32_t*> flags_;
  uint64_t out_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<OutputSink>> OpenCudaSink(const Register& reg, uint64_t out_bytes) {
  std::string reason;
  if (!cuda::StreamOpsUsable(&reason))
    return Status(Code::kFailedPrecondition,
                  "CUDA outputs, but the service cannot use CUDA: " + reason);
  auto sink = std::make_unique<CudaSink>();
  FERRY_RETURN_IF_ERROR(sink->Open(reg, out_bytes));
  return std::unique_ptr<OutputSink>(std::move(sink));
}

}  // namespace ferry::embed::service
