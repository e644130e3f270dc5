#include "engine/coalesce.h"

namespace ferry::internal {

std::vector<TransferOp> CoalesceOps(std::span<const TransferOp> ops) {
  std::vector<TransferOp> out(ops.begin(), ops.end());
  out.resize(CoalesceInPlace(out));
  return out;
}

size_t CoalesceInPlace(std::span<TransferOp> ops) {
  size_t n = 0;  // ops[0, n) is the merged batch so far; n never passes the op being read
  for (size_t i = 0; i < ops.size(); ++i) {
    const TransferOp o = ops[i];
    if (o.size == 0) continue;
    if (n > 0) {
      TransferOp& last = ops[n - 1];
      if (o.local_offset == last.local_offset + last.size && o.remote_offset == last.remote_offset + last.size) {
        last.size += o.size;
        continue;
      }
    }
    ops[n++] = o;
  }
  return n;
}

}  // namespace ferry::internal
