// NvtxPush and NvtxPop (cuda/nvtx.h) in the "ferry" domain, through NVTX v3 (header-only, from
// the CUDA toolkit): without a profiler attached each call is a check and a return.
#include "cuda/nvtx.h"

#include <nvtx3/nvToolsExt.h>

namespace ferry::cuda {
namespace {

nvtxDomainHandle_t Domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("ferry");
  return domain;
}

}  // namespace

void NvtxPush(const char* name) noexcept {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(Domain(), &a);
}

void NvtxPop() noexcept { nvtxDomainRangePop(Domain()); }

}  // namespace ferry::cuda
