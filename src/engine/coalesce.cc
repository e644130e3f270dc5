#include "engine/coalesce.h"

namespace ferry::internal {

std::vector<TransferOp> CoalesceOps(std::span<const TransferOp> ops) {
  std::vector<TransferOp> out;
  out.reserve(ops.size());
  for (const TransferOp& o : ops) {
    if (o.size == 0) continue;
    if (!out.empty()) {
      TransferOp& last = out.back();
      if (o.local_offset == last.local_offset + last.size && o.remote_offset == last.remote_offset + last.size) {
        last.size += o.size;
        continue;
      }
    }
    out.push_back(o);
  }
  return out;
}

}  // namespace ferry::internal
