#include "transport_flag.h"

#include <fmt/format.h>

#include <algorithm>

#include "ferry/system.h"

namespace ferry::tools {

Status CheckTransportNames(const std::vector<std::string>& asked, const std::vector<std::string>& compiled) {
  for (const std::string& name : asked) {
    if (std::find(compiled.begin(), compiled.end(), name) != compiled.end()) continue;
    return Status(Code::kInvalidArgument,
                  fmt::format("--transport {}: no such transport in this build (there are: {})",
                              name.empty() ? "''" : name, fmt::join(compiled, ", ")));
  }
  return Status::Ok();
}

Status CheckTransportFlag(const std::vector<std::string>& asked) {
  if (asked.empty()) return Status::Ok();
  return CheckTransportNames(asked, Probe().transports_compiled);
}

Status CheckTransportAlloc(const std::vector<std::string>& asked, bool shared_alloc) {
  const bool only_shm =
      !asked.empty() && std::all_of(asked.begin(), asked.end(), [](const std::string& t) { return t == "shm"; });
  if (only_shm && !shared_alloc)
    return Status(Code::kInvalidArgument, "--transport shm carries shared memory only: add --alloc shared");
  return Status::Ok();
}

}  // namespace ferry::tools
