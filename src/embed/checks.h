// The range check of the embedding layer's validators (Layout::Create, the gatherer's, the
// service's and its step policy's options): one message shape for a value outside its range,
// so that every refused option names itself and its range the same way.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "ferry/status.h"

namespace ferry::embed {

// Ok when lo <= v <= hi; otherwise kInvalidArgument "<what> must be in [lo, hi], not <v>".
template <typename T>
Status CheckInRange(std::string_view what, T v, std::type_identity_t<T> lo,
                    std::type_identity_t<T> hi) {
  if (v >= lo && v <= hi) return Status::Ok();
  return Status(Code::kInvalidArgument, std::string(what) + " must be in [" + std::to_string(lo) +
                                            ", " + std::to_string(hi) + "], not " +
                                            std::to_string(v));
}

}  // namespace ferry::embed
