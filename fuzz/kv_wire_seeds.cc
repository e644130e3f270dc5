// Writes seed inputs for kv_wire_fuzz into the directory given as argv[1]: each input is one
// selector byte (0 message, 1 layout, 2 worker metadata, 3 read params; see kv_wire_fuzz.cc)
// and an encoding: every message type, scattered and consecutive block runs, layouts of every
// tensor order, worker metadata, read params, and a few malformed ones (cut short, another
// version).
#include <cstdio>
#include <fstream>
#include <string>

#include "ferry/kv.h"
#include "kv/wire.h"

namespace {

using namespace ferry::kv;

std::string g_dir;
int g_count = 0;

void Write(char selector, const std::string& bytes) {
  std::ofstream(g_dir + "/seed" + std::to_string(g_count++), std::ios::binary) << selector << bytes;
}

CacheLayout Layout(TensorOrder order, bool one_region) {
  CacheLayout id;
  id.model = "llama";
  id.head_dim = 64;
  id.total_kv_heads = order == TensorOrder::kMla ? 1 : 4;
  id.mla = order == TensorOrder::kMla;
  id.num_layers = 2;
  id.tp_rank = 1;
  id.tp_size = 2;
  id.block_tokens = 16;
  id.kernel_block_tokens = 8;
  id.num_blocks = 4;
  auto got = MakeLayout(id, order, one_region);
  return got.ok() ? *got : id;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  for (int t = 1; t <= static_cast<int>(MsgType::kReleaseAck); ++t) {
    Message m;
    m.type = static_cast<MsgType>(t);
    m.request = t == 7 ? "" : "req-" + std::to_string(t);
    m.from = WorkerId{"decode", 1, 1};
    m.from_tp_size = 2;
    if (m.type == MsgType::kAllocation) {
      m.blocks = {3, 4, 5, 6, 10, 12, 13, 1};
      m.num_tokens = 100;
      m.first_token = 16;
      m.handshake = "127.0.0.1:7000";
    }
    if (m.type == MsgType::kCompletion) {
      m.layers = 2;
      m.checksums = {0x1234, 0xffffffffffffffffull};
    }
    if (m.type == MsgType::kWriteFailed || m.type == MsgType::kAbort) {
      m.code = 14;
      m.error = "peer lost";
    }
    const std::string bytes = Encode(m);
    Write(0, bytes);
    if (t == 1) {
      Write(0, bytes.substr(0, bytes.size() / 2));
      std::string v2 = bytes;
      v2[1] = 2;  // the version, after the array header
      Write(0, v2);
      m.blocks.clear();
      for (uint64_t b = 1000; b < 2000; ++b) m.blocks.push_back(b);
      Write(0, Encode(m));
    }
  }
  for (TensorOrder order : {TensorOrder::kKvFirst, TensorOrder::kKvFirstHnd,
                            TensorOrder::kBlocksFirst, TensorOrder::kSeparate, TensorOrder::kMla})
    for (bool one : {false, true}) Write(1, Layout(order, one).Pack());

  WorkerMetadata meta;
  meta.layout = Layout(TensorOrder::kBlocksFirst, true);
  meta.id = WorkerId{"prefill", meta.layout.dp_rank, meta.layout.tp_rank};
  meta.engine.key = "engine";
  meta.engine.host_id = "host";
  meta.engine.addresses = {"127.0.0.1:9000"};
  for (size_t i = 0; i < meta.layout.region_bytes.size(); ++i) {
    ferry::MemoryDesc d;
    d.engine_key = meta.engine.key;
    d.size = meta.layout.region_bytes[i];
    d.address = 4096;
    meta.regions.push_back(d);
  }
  meta.compatibility_hash = meta.layout.CompatibilityHash();
  const std::string packed = meta.Pack();
  Write(2, packed);
  Write(2, packed.substr(0, packed.size() - 3));
  meta.compatibility_hash ^= 1;
  Write(2, meta.Pack());

  ReadParams p;
  p.request = "req-9";
  p.producer = WorkerId{"prefill", 0, 1};
  p.producer_tp_size = 2;
  p.handshake = "127.0.0.1:7001";
  p.blocks = {8, 9, 10, 2};
  p.num_tokens = 60;
  Write(3, p.Pack());
  return 0;
}
