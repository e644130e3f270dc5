#include "ferry/system.h"

#include "cuda/runtime.h"
#include "ferry/engine.h"
#include "transport/transport.h"

namespace ferry {

bool CudaAvailable(std::string* reason) {
  bool ok = cuda::Available();
  if (!ok && reason != nullptr) *reason = cuda::UnavailableReason();
  return ok;
}

SystemInfo Probe() {
  SystemInfo info;
  info.version = std::string(Version());
  for (const auto& entry : internal::RegisteredTransports()) {
    info.transports_compiled.emplace_back(entry.name);
  }
  auto engine = Engine::Create();
  if (engine.ok()) {
    info.transports_usable = (*engine)->transports();
    info.transports = (*engine)->transport_info();
  }
  info.cuda_built = cuda::Built();
  info.cuda_available = cuda::Available();
  if (!info.cuda_available) info.cuda_unavailable_reason = cuda::UnavailableReason();
  if (info.cuda_built) {
    info.cuda_architectures = cuda::BuiltArchitectures();
    info.cuda_architectures_described = cuda::DescribeArchitectures(info.cuda_architectures);
  }
  for (const auto& d : cuda::Devices()) {
    const Status k = cuda::KernelsLoad(d.ordinal);
    info.gpus.push_back(GpuInfo{d.ordinal, d.name, d.memory_bytes, d.sm_major, d.sm_minor,
                                k.ok() ? "ok" : std::string(k.message())});
  }
  return info;
}

}  // namespace ferry
