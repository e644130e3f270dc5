// The smallest use of ferry::Engine: two engines in one process, a batched write from one's
// memory into the other's, and a notification that arrives after the data.
//
// Between processes or hosts the steps are the same; only the descriptors (EngineDesc,
// MemoryDesc) travel through a side channel of your choice as the bytes of Pack().
#include <cstdio>
#include <cstring>
#include <vector>

#include "ferry/engine.h"

namespace {

// Prints the error and returns 1, so that main() can `return Fail(...)`.
int Fail(const char* what, const ferry::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  // 1. Two engines. Each would normally live in its own process (prefill, decode).
  ferry::EngineOptions a_options, b_options;
  a_options.key = "sender";
  b_options.key = "receiver";
  auto a = ferry::Engine::Create(a_options);
  if (!a.ok()) return Fail("Engine::Create", a.status());
  auto b = ferry::Engine::Create(b_options);
  if (!b.ok()) return Fail("Engine::Create", b.status());

  // 2. Register memory. The buffers must outlive their registrations.
  std::vector<unsigned char> src(1 << 16), dst(1 << 16, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  auto src_mem = (*a)->RegisterMemory(src.data(), src.size());
  if (!src_mem.ok()) return Fail("RegisterMemory", src_mem.status());
  auto dst_mem = (*b)->RegisterMemory(dst.data(), dst.size());
  if (!dst_mem.ok()) return Fail("RegisterMemory", dst_mem.status());

  // 3. Tell the sender about the receiver. Across processes, send (*b)->Describe().Pack() and
  //    dst_mem->Pack() and decode them with EngineDesc::Unpack / MemoryDesc::Unpack.
  if (auto s = (*a)->AddPeer((*b)->Describe()); !s.ok()) return Fail("AddPeer", s);
  auto session = (*a)->OpenSession(*src_mem, *dst_mem);
  if (!session.ok()) return Fail("OpenSession", session.status());
  std::printf("route: %s\n", session->path().ToString().c_str());

  // 4. One batched write of three pieces (local offset, remote offset, bytes), with a
  //    notification that the receiver gets only once every byte of the batch is in place.
  const std::vector<ferry::TransferOp> ops = {
      {0, 0, 4096}, {8192, 4096, 1024}, {16384, 32768, 512}};
  ferry::TransferOptions options;
  options.notification = "batch-0 landed";
  ferry::Transfer t = session->WriteBatch(ops, options);
  if (auto s = t.Wait(); !s.ok()) return Fail("WriteBatch", s);  // bounded by a deadline

  // 5. The receiver takes its notifications (topic "" is the application's).
  auto notes = (*b)->PopNotifications();
  if (notes.size() != 1 || notes[0].from != "sender" || notes[0].message != "batch-0 landed") {
    std::fprintf(stderr, "expected one notification from sender, got %zu\n", notes.size());
    return 1;
  }

  // 6. Every piece arrived, and nothing else was written.
  std::vector<unsigned char> want(dst.size(), 0);
  for (const auto& op : ops) std::memcpy(&want[op.remote_offset], &src[op.local_offset], op.size);
  if (dst != want) {
    std::fprintf(stderr, "the receiver's memory differs from what was written\n");
    return 1;
  }

  // 7. Deregister before the memory goes away.
  if (auto s = (*a)->DeregisterMemory(*src_mem); !s.ok()) return Fail("DeregisterMemory", s);
  if (auto s = (*b)->DeregisterMemory(*dst_mem); !s.ok()) return Fail("DeregisterMemory", s);
  std::printf("wrote %llu bytes in %zu pieces; notification: \"%s\"\n",
              static_cast<unsigned long long>(t.bytes()), ops.size(), notes[0].message.c_str());
  return 0;
}
