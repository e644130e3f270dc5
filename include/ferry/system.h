// What this build of ferry can do on this machine: version, transports compiled in and usable
// here, and the CUDA devices seen. Used by `ferry info`, the Python module and tests that skip
// where a GPU is missing.
//
// Thread safety: free functions, safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

struct GpuInfo {
  int ordinal = 0;
  std::string name;
  uint64_t memory_bytes = 0;
  int sm_major = 0;
  int sm_minor = 0;
  // "ok" when ferry's kernels load on this device, otherwise why not (a build without code
  // for its architecture).
  std::string kernels;
};

// A transport an engine started, and what it carries.
struct TransportInfo {
  std::string name;
  bool host_memory = false;
  bool cuda_memory = false;
  bool notifications = false;  // carries notifications itself (else another transport does)
  std::string reach;           // "process", "host" or "network"
};

struct SystemInfo {
  std::string version;
  std::vector<std::string> transports_compiled;  // in registration order
  std::vector<std::string> transports_usable;    // those an engine can start here
  std::vector<TransportInfo> transports;         // the usable ones, with what they carry
  bool cuda_built = false;                       // built with the CUDA toolkit
  bool cuda_available = false;                   // a driver and at least one device
  std::string cuda_unavailable_reason;           // empty when available
  std::string cuda_architectures;                // the kernels' architectures as built ("" without CUDA)
  std::string cuda_architectures_described;      // the same, in words
  std::vector<GpuInfo> gpus;
};

SystemInfo Probe();

// True when CUDA memory can be registered here; otherwise `reason` says why (for test skips).
bool CudaAvailable(std::string* reason = nullptr);

}  // namespace ferry
