// Methods of the value types in ferry/types.h.
#include "ferry/types.h"

namespace ferry {

std::string TransferPath::ToString() const {
  if (transport.empty()) return "none";
  return transport + (staged ? " (staged)" : " (direct)");
}

}  // namespace ferry
