// The layer checksum kernel's entry point in a build without CUDA: never reached (no GPU
// region exists without CUDA, and kv::Checksummer::Create refuses one first), present so that
// the library links.
#include "cuda/layer_hash.h"

namespace ferry::cuda {

int LaunchLayerHash(const LayerHashArgs&, CUstream_st*) { return kLayerHashUnsupported; }

}  // namespace ferry::cuda
