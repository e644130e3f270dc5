// Writes seed inputs for embed_protocol_fuzz into the directory given as argv[1]: one message
// of each type (host and CUDA registrations, a stats request and reply included) and a
// truncated one.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "embed/service/protocol.h"

namespace svc = ferry::embed::service;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  svc::Register host;
  host.dp_rank = 1;
  host.tp_size = 2;
  host.max_tokens = 8192;
  host.max_reqs = 256;
  host.context_len = 2;
  host.token_bytes = 5120;
  host.layers = {{0, 0, 4096, "", ""}, {1, 8192, 4160, "", ""}};
  host.has_inputs = true;
  host.inputs = {0, 32768, 33856};
  svc::Register cuda = host;
  cuda.mode = svc::OutputMode::kCuda;
  cuda.device = 0;
  cuda.tp_rank = 1;
  cuda.has_inputs = false;
  for (auto& l : cuda.layers) l.output_ipc = l.flag_ipc = std::string(64, '\x11');
  std::string reg = svc::Encode(host);
  svc::Stats stats;
  stats.stats.registrations = 3;
  stats.stats.steps_ok = 100;
  for (uint64_t b : {256, 8192}) {
    svc::BucketStats bucket;
    bucket.bucket = b;
    bucket.cpu_steps = 40;
    bucket.uva_steps = 3;
    bucket.copies = 800;
    for (auto& p : bucket.phases) p = {43, 43000, 900};
    stats.stats.buckets.push_back(bucket);
  }
  const std::vector<std::string> seeds = {
      reg,
      svc::Encode(cuda),
      svc::Encode(svc::Registered{ferry::Status::Ok()}),
      svc::Encode(svc::Request{7, 8192, 8, 1}),
      svc::Encode(svc::Reply{7, ferry::Status(ferry::Code::kOutOfRange, "id >= V")}),
      svc::Encode(svc::StatsRequest{true}),
      svc::Encode(stats),
      reg.substr(0, reg.size() / 2),
  };
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(std::string(argv[1]) + "/embed_protocol_seed_" + std::to_string(i),
                      std::ios::binary);
    out << seeds[i];
    if (!out) return 1;
  }
  return 0;
}
