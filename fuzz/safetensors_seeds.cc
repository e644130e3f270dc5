// Writes seed inputs for safetensors_fuzz into the directory given as argv[1]: valid files
// with one or more tensors and metadata, and a few near misses.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::string File(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\x5a');
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::vector<std::string> seeds = {
      File("{\"w\": {\"dtype\": \"BF16\", \"shape\": [4, 8], \"data_offsets\": [0, 64]}}", 64),
      File("{\"__metadata__\": {\"format\": \"pt\"}, \"a\": {\"dtype\": \"F8_E4M3\", \"shape\": "
           "[2, 3], \"data_offsets\": [0, 6]}, \"b\": {\"dtype\": \"F32\", \"shape\": [2], "
           "\"data_offsets\": [6, 14]}}  ",
           14),
      File("{\"s\": {\"dtype\": \"U8\", \"shape\": [], \"data_offsets\": [0, 1]}}", 1),
      File("{\"w\": {\"dtype\": \"BF16\", \"shape\": [4, 8], \"data_offsets\": [0, 65]}}", 64),
      File("{}", 0),
  };
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(std::string(argv[1]) + "/safetensors_seed_" + std::to_string(i),
                      std::ios::binary);
    out << seeds[i];
    if (!out) return 1;
  }
  return 0;
}
