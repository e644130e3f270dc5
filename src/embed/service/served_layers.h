// MakeServedLayers: the layers a service serves, from one base configuration (Config::layer
// ignored) and a list of layer indices: each layer's Layout, and either one synthetic table
// shared by all layers (sized for the largest layer unless `synthetic_rows` says otherwise) or
// one safetensors file per layer, in the order of `layers`.
//
// A synthetic table larger than the memory available (memory_limit, or with 0 the smaller of
// /proc/meminfo's MemAvailable and the cgroup's memory.max less memory.current) is refused with
// kResourceExhausted naming its size, before any of it is allocated.
//
// With `pin` non-null every table is also page-locked (Table::Pin, for the UVA path) before it is
// shared, and *pin gets the result: a table that cannot be pinned is still served (unpinned).
//
// Thread safety: a pure function; `pool` (optional) fills a synthetic table in parallel.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "embed/config.h"
#include "embed/service/server.h"
#include "ferry/status.h"

namespace ferry::embed::service {

// kInvalidArgument for no layers, a bad configuration or a file count other than 0 or
// layers.size(); kResourceExhausted for a synthetic table larger than the memory available; the
// table's errors otherwise.
Result<std::vector<ServedLayer>> MakeServedLayers(const Config& base,
                                                  std::span<const uint32_t> layers, Dtype dtype,
                                                  std::span<const std::string> files,
                                                  uint64_t synthetic_rows, ThreadPool* pool,
                                                  Status* pin = nullptr,
                                                  uint64_t memory_limit = 0);

// The bytes of memory this process may still take: the smaller of MemAvailable and what its
// cgroup (v2) allows; UINT64_MAX when neither can be read.
uint64_t AvailableMemoryBytes();

}  // namespace ferry::embed::service
