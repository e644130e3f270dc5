// The words of the kernel check (runtime.h): plain C++, in builds with and without CUDA, so
// that the message a user of an unsupported GPU reads is tested on machines without one.
#include <string>
#include <string_view>

#include "cuda/runtime.h"

namespace ferry::cuda {

std::string DescribeArchitectures(std::string_view archs) {
  std::string out;
  while (!archs.empty()) {
    const size_t end = archs.find_first_of("; ");  // CMake's list, or the same with spaces
    std::string_view entry = archs.substr(0, end);
    archs = end == std::string_view::npos ? std::string_view() : archs.substr(end + 1);
    if (entry.empty()) continue;
    if (!out.empty()) out += ", ";
    constexpr std::string_view kReal = "-real", kVirtual = "-virtual";
    const bool digits = entry.find_first_not_of("0123456789") != 0;
    if (digits && entry.ends_with(kReal)) {
      out += "sm_" + std::string(entry.substr(0, entry.size() - kReal.size()));
    } else if (digits && entry.ends_with(kVirtual)) {
      out += "PTX " + std::string(entry.substr(0, entry.size() - kVirtual.size()));
    } else if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string_view::npos) {
      out += "sm_" + std::string(entry) + " + PTX " + std::string(entry);  // CMake's bare number: both
    } else {
      out += entry;  // "native", "all", "all-major": CMake's keywords, left as written
    }
  }
  return out.empty() ? "no architecture" : out;
}

std::string KernelsUnsupportedMessage(const DeviceInfo& device, std::string_view built_archs,
                                      std::string_view cuda_error) {
  const std::string sm = std::to_string(device.sm_major * 10 + device.sm_minor);
  std::string m = "ferry's CUDA kernels cannot run on device " + std::to_string(device.ordinal) + " (" +
                  device.name + ", sm_" + sm + "): this build has code for " +
                  DescribeArchitectures(built_archs) + " only";
  if (!cuda_error.empty()) m += " (" + std::string(cuda_error) + ")";
  m += "; rebuild ferry for it: cmake -DFERRY_CUDA_ARCHS=\"" + sm + "-real\" (or a list with " + sm +
       " in it; see README, CUDA architectures)";
  return m;
}

}  // namespace ferry::cuda
