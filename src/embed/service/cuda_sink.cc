// OpenCudaSink with CUDA: output buffers and flags opened from the client's IPC handles.
#include "embed/service/cuda_sink.h"

#include <map>
#include <mutex>

#include "embed/service/gpu_ops.h"

namespace ferry::embed::service {
namespace {

constexpr auto kFlagTimeout = std::chrono::seconds(2);

class CudaSink final : public OutputSink {
 public:
  ~CudaSink() override {
    if (copy_stream_ != nullptr) {
      (void)gpu::SetDevice(device_);
      (void)gpu::StreamSync(copy_stream_, Deadline::After(kFlagTimeout));
      (void)gpu::StreamDestroy(copy_stream_);
    }
    if (done_event_ != nullptr) (void)gpu::EventDestroy(done_event_);
    if (flag_word_ != nullptr) (void)gpu::HostFree(flag_word_);
    if (flag_stream_ != nullptr) (void)gpu::StreamDestroy(flag_stream_);
    if (read_event_ != nullptr) (void)gpu::EventDestroy(read_event_);
    for (auto& [handle, base] : opened_) (void)gpu::IpcClose(base);
  }

  Status Open(const Register& reg, uint64_t out_bytes) {
    device_ = reg.device;
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));
    FERRY_ASSIGN_OR_RETURN(copy_stream_, gpu::StreamCreate());
    FERRY_ASSIGN_OR_RETURN(flag_stream_, gpu::StreamCreate());
    FERRY_ASSIGN_OR_RETURN(done_event_, gpu::EventCreate());
    FERRY_ASSIGN_OR_RETURN(read_event_, gpu::EventCreate());
    FERRY_ASSIGN_OR_RETURN(void* word, gpu::HostAlloc(sizeof(uint32_t)));
    flag_word_ = static_cast<uint32_t*>(word);
    for (const LayerOutput& l : reg.layers) {
      // Every offset and size is checked against the allocation the driver mapped.
      FERRY_ASSIGN_OR_RETURN(uint8_t * out, Base(l.output_ipc));
      FERRY_ASSIGN_OR_RETURN(uint8_t * flag, Base(l.flag_ipc));
      FERRY_ASSIGN_OR_RETURN(uint64_t out_alloc, gpu::AllocationBytes(out));
      FERRY_ASSIGN_OR_RETURN(uint64_t flag_alloc, gpu::AllocationBytes(flag));
      if (l.output_offset > out_alloc || out_bytes > out_alloc - l.output_offset ||
          l.flag_offset > flag_alloc || 4 > flag_alloc - l.flag_offset)
        return Status(Code::kOutOfRange, "layer " + std::to_string(l.layer) +
                                             ": output or flag outside its CUDA allocation");
      outputs_.push_back(out + l.output_offset);
      flags_.push_back(reinterpret_cast<uint32_t*>(flag + l.flag_offset));
    }
    out_bytes_ = out_bytes;
    return Status::Ok();
  }

  size_t slots() const override { return outputs_.size(); }
  bool wants_pinned_source() const override { return true; }

  Status Write(size_t slot, uint64_t offset, const uint8_t* src, uint64_t bytes) override {
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));  // the copy pump's thread calls this
    return gpu::MemcpyAsync(outputs_[slot] + offset, src, bytes, copy_stream_);
  }
  Status Finish(size_t slot, uint32_t value) override {
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));
    FERRY_RETURN_IF_ERROR(gpu::StreamWrite(copy_stream_, flags_[slot], value));
    return gpu::EventRecord(done_event_, copy_stream_);
  }
  Status WaitFinished(Deadline deadline) override {
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));
    return gpu::EventSpin(done_event_, deadline);
  }
  int device() const override { return device_; }
  void* stream() override { return copy_stream_; }
  uint8_t* device_output(size_t slot) override { return outputs_[slot]; }
  Status WaitEvent(void* event) override {
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));
    return gpu::StreamWaitEvent(copy_stream_, event);
  }
  Status Signal(size_t slot, uint32_t value) override {
    std::lock_guard<std::mutex> lock(flag_mu_);
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));
    FERRY_RETURN_IF_ERROR(gpu::StreamWrite(flag_stream_, flags_[slot], value));
    return gpu::StreamSync(flag_stream_, Deadline::After(kFlagTimeout));
  }
  // One 4-byte copy into a page-locked word (a true asynchronous copy, no staging through a
  // driver buffer) and a spinning wait for it: the read is on every layer step's path.
  Result<uint32_t> ReadFlag(size_t slot) override {
    std::lock_guard<std::mutex> lock(flag_mu_);
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));
    *flag_word_ = kFlagFailed;
    FERRY_RETURN_IF_ERROR(
        gpu::MemcpyAsync(flag_word_, flags_[slot], sizeof(uint32_t), flag_stream_));
    FERRY_RETURN_IF_ERROR(gpu::EventRecord(read_event_, flag_stream_));
    FERRY_RETURN_IF_ERROR(gpu::EventSpin(read_event_, Deadline::After(kFlagTimeout)));
    return LoadFlag(flag_word_);
  }
  Status Drain(Deadline deadline) override {
    FERRY_RETURN_IF_ERROR(gpu::SetDevice(device_));
    return gpu::StreamSync(copy_stream_, deadline);
  }

 private:
  Result<uint8_t*> Base(const std::string& handle) {
    auto it = opened_.find(handle);
    if (it != opened_.end()) return static_cast<uint8_t*>(it->second);
    FERRY_ASSIGN_OR_RETURN(void* base, gpu::IpcOpen(handle));
    opened_[handle] = base;
    return static_cast<uint8_t*>(base);
  }

  int device_ = 0;
  void* done_event_ = nullptr;     // recorded after each Finish()'s flag write
  void* read_event_ = nullptr;     // used under flag_mu_
  uint32_t* flag_word_ = nullptr;  // page-locked; GUARDED_BY(flag_mu_)
  void* copy_stream_ = nullptr;
  void* flag_stream_ = nullptr;
  std::mutex flag_mu_;
  std::map<std::string, void*> opened_;  // IPC handle -> mapped base
  std::vector<uint8_t*> outputs_;
  std::vector<uint32_t*> flags_;
  uint64_t out_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<OutputSink>> OpenCudaSink(const Register& reg, uint64_t out_bytes) {
  std::string reason;
  if (!gpu::Usable(&reason))
    return Status(Code::kFailedPrecondition,
                  "CUDA outputs, but the service cannot use CUDA: " + reason);
  auto sink = std::make_unique<CudaSink>();
  FERRY_RETURN_IF_ERROR(sink->Open(reg, out_bytes));
  return std::unique_ptr<OutputSink>(std::move(sink));
}

}  // namespace ferry::embed::service
