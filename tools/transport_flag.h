// `--transport NAME` (repeated), as `ferry bench` and `ferry demo` take it: the transports the
// engines may start. A name that is no transport of this build is bad usage, refused before
// any engine starts, with the names there are.
//
// Thread safety: free functions.
#pragma once

#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools {

// kInvalidArgument, naming the flag's bad value and the transports of `compiled`, unless every
// name asked for is among them.
Status CheckTransportNames(const std::vector<std::string>& asked, const std::vector<std::string>& compiled);

// The same against the transports compiled into this build (ferry::Probe()).
Status CheckTransportFlag(const std::vector<std::string>& asked);

// `shm` maps only memory from shared allocations (ferry/shared_memory.h): with only `shm`
// asked for, heap memory (`--alloc heap`) has no transport. kInvalidArgument, naming --alloc
// shared, in that case.
Status CheckTransportAlloc(const std::vector<std::string>& asked, bool shared_alloc);

}  // namespace ferry::tools
