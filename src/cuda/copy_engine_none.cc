// The copy engines of a build without the CUDA toolkit: a set of no devices, so that an engine
// makes and shares one set (TransportContext::copy_engines) whether or not CUDA is built.
#include "cuda/copy_engine.h"

namespace ferry::cuda {

// No CopyEngine is ever made in this build; CopyEngines' slots still name its destructor.
CopyEngine::~CopyEngine() = default;

CopyEngines::CopyEngines() = default;

Result<CopyEngine*> CopyEngines::For(int /*device*/) {
  return Status(Code::kUnsupported, "ferry was built without CUDA");
}

CopyStats CopyEngines::stats() { return {}; }

}  // namespace ferry::cuda
