// A program outside ferry's tree, built against an installed ferry (install_test.sh): two
// engines, a local write between registered buffers, every byte checked; one call each into the
// KV and embedding parts, so that a library missing them fails to link.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ferry/embed.h"
#include "ferry/engine.h"
#include "ferry/kv.h"

namespace {

int Fail(const char* what, const ferry::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  auto a = ferry::Engine::Create({.key = "consumer-a"});
  auto b = ferry::Engine::Create({.key = "consumer-b"});
  if (!a.ok()) return Fail("Engine::Create", a.status());
  if (!b.ok()) return Fail("Engine::Create", b.status());
  std::vector<uint8_t> src(1 << 16), dst(1 << 16, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  auto src_mem = (*a)->RegisterMemory(src.data(), src.size());
  auto dst_mem = (*b)->RegisterMemory(dst.data(), dst.size());
  if (!src_mem.ok()) return Fail("RegisterMemory", src_mem.status());
  if (!dst_mem.ok()) return Fail("RegisterMemory", dst_mem.status());
  if (ferry::Status s = (*a)->AddPeer((*b)->Describe()); !s.ok()) return Fail("AddPeer", s);
  auto session = (*a)->OpenSession(*src_mem, *dst_mem);
  if (!session.ok()) return Fail("OpenSession", session.status());
  // Two ops: the first half lands shifted by 4 KiB, the second half in place.
  std::vector<ferry::TransferOp> ops = {{0, 4096, 16384}, {32768, 32768, 32768}};
  if (ferry::Status s = session->WriteBatch(ops).Wait(); !s.ok()) return Fail("WriteBatch", s);
  for (size_t i = 0; i < 16384; ++i) {
    if (dst[4096 + i] != src[i]) return Fail("bytes", ferry::Status(ferry::Code::kDataLoss, "first op"));
  }
  for (size_t i = 32768; i < src.size(); ++i) {
    if (dst[i] != src[i]) return Fail("bytes", ferry::Status(ferry::Code::kDataLoss, "second op"));
  }
  auto order = ferry::kv::ParseTensorOrder(ferry::kv::TensorOrderName(ferry::kv::TensorOrder{}));
  auto dtype = ferry::embed::ParseDtype("bf16");
  if (!order.ok() || !dtype.ok()) return Fail("kv/embed", ferry::Status(ferry::Code::kInternal, "parse"));
  std::printf("consumer: ferry %s, %zu bytes checked\n", std::string(ferry::Version()).c_str(),
              src.size() - 16384);
  return 0;
}
