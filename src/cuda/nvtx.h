// NVTX ranges: ferry's posts and copies, named on the timeline of Nsight Systems (in the
// "ferry" domain), so that a profile of an inference server shows which CUDA calls and kernels
// a transfer made. NVTX v3 ships with the CUDA toolkit (nvtx3/nvToolsExt.h, header-only) and
// costs a branch per range while no profiler is attached. Without CUDA a range compiles to
// nothing.
//
// Use one range per batch (a post of many pieces), never per piece.
//
// Thread safety: a range is pushed and popped on the thread that made it (NVTX's ranges nest
// per thread); any number of threads may hold ranges at once.
#pragma once

namespace ferry::cuda {

#if defined(FERRY_HAVE_CUDA)
// nvtx.cc: the NVTX calls, so that only src/cuda's own files see the toolkit's headers.
void NvtxPush(const char* name) noexcept;
void NvtxPop() noexcept;
#else
inline void NvtxPush(const char*) noexcept {}
inline void NvtxPop() noexcept {}
#endif

class NvtxRange {
 public:
  // REQUIRES: `name` is a string literal (or outlives the range).
  explicit NvtxRange(const char* name) noexcept { NvtxPush(name); }
  ~NvtxRange() { NvtxPop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace ferry::cuda
