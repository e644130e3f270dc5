// Writes seed inputs for the shm message fuzzer: `shm_seeds DIR`.
#include <fstream>
#include <string>

#include "transport/shm/wire.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  using namespace ferry::internal::shm;
  const std::string dir = argv[1];
  Header h;
  h.type = MsgType::kHello;
  h.size = 9;
  std::ofstream(dir + "/hello") << Encode(h, "prefill-0");
  h = Header{};
  h.type = MsgType::kOpen;
  h.token = 1;
  h.region = 3;
  h.offset = 0x7f0000000000;
  h.size = 1 << 20;
  std::ofstream(dir + "/open") << Encode(h);
  h.type = MsgType::kOpenReply;
  h.offset = 4096;
  h.size = 12;
  h.extra = 99;
  std::ofstream(dir + "/open_reply") << Encode(h);
  h = Header{};
  h.type = MsgType::kRing;
  h.size = 1 << 18;
  h.offset = 65536;
  std::ofstream(dir + "/ring") << Encode(h);
  h = Header{};
  h.type = MsgType::kWake;
  std::ofstream(dir + "/wake") << Encode(h);
  h = Header{};
  h.type = MsgType::kAck;
  h.token = 2;
  h.code = 8;
  std::ofstream(dir + "/ack") << Encode(h);
  h = Header{};
  h.type = MsgType::kRevoke;
  h.region = 3;
  std::ofstream(dir + "/revoke") << Encode(h);
  return 0;
}
