// Writes seed inputs for the descriptor fuzzer: `make_seeds DIR`.
#include <fstream>
#include <string>

#include "ferry/descriptors.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::string dir = argv[1];
  ferry::MemoryDesc m;
  m.engine_key = "prefill-0";
  m.region = static_cast<ferry::RegionId>(3);
  m.address = 0x7f0000000000;
  m.size = 1 << 30;
  m.kind = ferry::MemoryKind::kCuda;
  m.device = 0;
  m.host_id = "host/boot";
  m.access = {{"local", "123:4.5.6.7."}, {"ucx", std::string(64, '\x11')}};
  std::ofstream(dir + "/memory") << m.Pack();
  ferry::EngineDesc e;
  e.key = "decode-1";
  e.host_id = "host/boot";
  e.pid = 77;
  e.addresses = {"127.0.0.1:5555"};
  e.transports = {{"local", "123:4.5.6.7."}};
  std::ofstream(dir + "/engine") << e.Pack();
  return 0;
}
