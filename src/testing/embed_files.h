// Helpers of the embed tests: temporary files and safetensors files written byte by byte.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "base/endian.h"

namespace ferry::embed::testing {

// A file in the test's temporary directory, removed when the object dies.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    char name[] = "/tmp/ferry_embed_test_XXXXXX";
    int fd = mkstemp(name);
    path_ = name;
    if (fd >= 0) {
      size_t off = 0;
      while (off < contents.size()) {
        ssize_t n = write(fd, contents.data() + off, contents.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      close(fd);
    }
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A safetensors file: 8-byte little-endian header length, the header, the data.
inline std::string Safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  StoreLe64(out.data(), uint64_t{header.size()});
  return out + header + data;
}

// A one-tensor header {"name": {"dtype": dtype, "shape": [rows, cols], "data_offsets": [0, b]}}.
inline std::string OneTensorHeader(const std::string& name, const std::string& dtype, uint64_t rows,
                                   uint64_t cols, uint64_t bytes) {
  return "{\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": [" + std::to_string(rows) +
         ", " + std::to_string(cols) + "], \"data_offsets\": [0, " + std::to_string(bytes) +
         "]}, \"__metadata__\": {\"format\": \"pt\"}}";
}

}  // namespace ferry::embed::testing
