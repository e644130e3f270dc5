#include "embed/service/output_sink.h"

#include <cstring>

namespace ferry::embed::service {

Status HostSink::Write(size_t slot, uint64_t offset, const uint8_t* src, uint64_t bytes) {
  std::memcpy(memory_->data() + outputs_[slot] + offset, src, bytes);
  return Status::Ok();
}

}  // namespace ferry::embed::service
