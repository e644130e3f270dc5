// Writes seed inputs for gpu_wire_fuzz: `fuzz_make_gpu_seeds DIR`.
#include <fstream>
#include <string>
#include <vector>

#include "transport/cuda_ipc/ipc_desc.h"
#include "transport/ucx/am_wire.h"
#include "transport/ucx/door_wire.h"
#include "transport/ucx/staged_wire.h"

using namespace ferry::internal;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::string dir = argv[1];
  cuda_ipc::RegionAccess r;
  r.process_token = "77:00112233";
  r.offset = 4096;
  r.allocation_size = 1 << 24;
  r.lease_slot = 3;
  r.region = 9;
  std::ofstream(dir + "/region") << cuda_ipc::PackRegionAccess(r);
  // VMM memory: runs of descriptors (12..14 of 4 MiB, 20 of 4 MiB)
  r.pid = 77;
  r.export_id = 5;
  r.pieces = {{12, 4 << 20}, {13, 4 << 20}, {14, 4 << 20}, {20, 4 << 20}};
  r.allocation_size = 16 << 20;
  std::ofstream(dir + "/region_vmm") << cuda_ipc::PackRegionAccess(r);
  std::ofstream(dir + "/engine") << cuda_ipc::PackEngineAccess({"77:00112233", "/ferry-ipc-77-0a0b"});
  std::vector<ucx::StagedPiece> pieces = {{0, 100}, {4096, 32768}};
  std::string table = ucx::EncodeStagedReadReq(pieces);
  std::ofstream(dir + "/pieces") << table;
  std::ofstream(dir + "/staged_write") << table + std::string(100 + 32768, '\x33');
  // An active-message header with its payload: a notification.
  const std::string message = "layer 7 of request 42 written";
  ucx::AmHeader h;
  h.type = ucx::MsgType::kNotify;
  h.conn = 0x1234567890abcdefull;
  h.token = 99;
  h.size = message.size();
  uint8_t header[ucx::kAmHeaderBytes];
  ucx::EncodeHeader(h, header);
  std::ofstream(dir + "/notify") << std::string(reinterpret_cast<const char*>(header), sizeof(header)) +
                                        ucx::EncodeNotify(message);
  std::ofstream(dir + "/hello") << ucx::EncodeHello({"prefill-0", "decode-0", 2, std::string(200, '\x11')});
  ucx::Welcome w;
  w.key = "decode-0";
  w.conn_id = 0x1234567890abcdefull;
  w.worker_address = std::string(180, '\x22');
  std::ofstream(dir + "/welcome") << ucx::EncodeWelcome(w);
  ucx::Hello authed{"prefill-0", "decode-0", 1, std::string(64, '\x11'), std::string(32, '\x33')};
  std::ofstream(dir + "/hello_nonce") << ucx::EncodeHello(authed);
  const std::string target_nonce(32, '\x44');
  std::ofstream(dir + "/challenge") << ucx::EncodeChallenge({target_nonce, ucx::TargetProof("seed-secret-0123456", authed, target_nonce)});
  std::ofstream(dir + "/proof") << ucx::EncodeProof({ucx::InitiatorProof("seed-secret-0123456", authed, target_nonce)});
  return 0;
}
