// libFuzzer target: opening embedding table files (Table::Open, src/embed/table.cc): the
// safetensors header, the tensor's dtype and shape against the layout, the rows of several
// files adding up to the table. The layout is fixed and small (V 100, N 3, H 2, d 8, primes
// >= 5: 36 rows, 40 padded). Input: a flags byte (bit 0: two files, bit 1: ask for the tensor
// "w" by name), a split byte (where the second file starts), then the files' bytes, written to
// memory files. Every input must be refused with kInvalidArgument or open to a table of
// 36 or 40 rows whose every row is the file's bytes at the tensor's offset.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "embed/safetensors.h"
#include "ferry/embed.h"

namespace {

using namespace ferry::embed;

const Layout& TinyLayout() {
  static const Layout layout = [] {
    Config c;
    c.vocab_size = 100;
    c.eos_id = 1;
    c.ngram_size = 3;
    c.heads_per_ngram = 2;
    c.embed_dim = 8 * 2 * 2;  // d 8 over G = (N - 1) H = 4 heads
    c.base_vocab = 5;
    c.row_padding = 8;
    auto l = Layout::Create(c);
    if (!l.ok()) __builtin_trap();
    return *l;
  }();
  return layout;
}

// A memory file holding `bytes`; its path is /proc/self/fd/N.
struct MemFile {
  int fd = -1;
  explicit MemFile(std::span<const uint8_t> bytes) {
    fd = memfd_create("table_file_fuzz", MFD_CLOEXEC);
    if (fd < 0) __builtin_trap();
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) __builtin_trap();
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { close(fd); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool two = data[0] & 1;
  const std::span<const uint8_t> all(data + 2, size - 2);
  const size_t split = two ? all.size() * data[1] / 255 : all.size();
  std::vector<std::span<const uint8_t>> files = {all.subspan(0, split)};
  if (two) files.push_back(all.subspan(split));
  std::vector<MemFile> mem;
  mem.reserve(files.size());
  std::vector<std::string> paths;
  for (const auto& f : files) {
    mem.emplace_back(f);
    paths.push_back(mem.back().path());
  }
  Table::OpenOptions options;
  if (data[0] & 2) options.tensor_name = "w";
  const Layout& layout = TinyLayout();
  auto table = Table::Open(layout, paths, options);
  if (!table.ok()) {
    if (table.status().code() != ferry::Code::kInvalidArgument) __builtin_trap();
    return 0;
  }
  const Table& t = **table;
  if (t.rows() != layout.table_rows() && t.rows() != layout.used_rows()) __builtin_trap();
  if (t.row_bytes() == 0 || t.row_bytes() > 8 * 4) __builtin_trap();
  // Each file's rows, in order: the bytes of its tensor (the named one, or its only one).
  uint64_t row = 0;
  for (const auto& f : files) {
    auto header = ParseSafetensors(f);
    if (!header.ok()) __builtin_trap();
    const SafetensorsTensor* tensor = nullptr;
    for (const auto& x : header->tensors)
      if (options.tensor_name.empty() || x.name == options.tensor_name) tensor = &x;
    if (tensor == nullptr || (tensor->end - tensor->begin) % t.row_bytes() != 0) __builtin_trap();
    const uint64_t rows = (tensor->end - tensor->begin) / t.row_bytes();
    for (uint64_t r = 0; r < rows; ++r, ++row) {
      if (row >= t.rows()) __builtin_trap();
      if (std::memcmp(t.Row(row), f.data() + tensor->begin + r * t.row_bytes(), t.row_bytes()) != 0)
        __builtin_trap();
    }
  }
  if (row != t.rows()) __builtin_trap();
  return 0;
}
