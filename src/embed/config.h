// The n-gram embedding table's configuration (Config) and the layout derived from it (Layout):
// hash multipliers, head sizes and offsets, and the number of table rows.
//
// The row-id specification, followed exactly (all arithmetic on uint64_t, wrapping):
//   G = (N - 1) H heads, head dim d = E / G.
//   SplitMix64(x): x += 0x9E3779B97F4A7C15; x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
//                  x = (x ^ (x >> 27)) * 0x94D049BB133111EB; return x ^ (x >> 31).
//   half = max(1, floor(floor((2^63 - 1) / V) / 2));
//   m_k = 2 * (SplitMix64(S + 10007 L + 0x9E3779B97F4A7C15 (k + 1)) mod half) + 1, k < N.
//   Head h (global head g = L G + h) has size_h = the (g+1)-th prime >= B (primes counted from
//   the first prime >= B), offset_h = size_0 + ... + size_(h-1); the table has
//   ceil(sum / P) * P rows. Row ids of a step: row_ids.h.
// A table row is one head's d values (row_bytes = d * element size, or d/2 + d/16 for NVFP4);
// a token's output is its G rows concatenated in head order: E values.
//
// Thread safety: Config and Layout are values; a const Layout may be shared by any threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "embed/fastmod.h"
#include "ferry/status.h"

namespace ferry::embed {

inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

constexpr uint64_t SplitMix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Config {
  int64_t vocab_size = 0;      // V; token ids are int32, so 1 <= V <= 2^31
  int64_t eos_id = 0;          // EOS, 0 <= EOS < V
  int ngram_size = 0;          // N >= 2 (at most kMaxNgram)
  int heads_per_ngram = 0;     // H >= 1
  int64_t embed_dim = 0;       // E, divisible by G
  uint64_t seed = 1234;        // S
  uint64_t base_vocab = 0;     // B >= 1
  uint64_t row_padding = 128;  // P >= 1
  int layer = 0;               // L >= 0 (the dense layer index)

  // The model ferry serves first: V 248320, N 3, H 8, E 2560 (G 16, d 160), B 2e7, P 128,
  // S 1234. Its EOS id comes from the model's tokenizer config, so the caller passes it.
  static Config Model(int64_t eos_id, int layer = 0);
  std::string ToString() const;
};

inline constexpr int kMaxNgram = 16;
inline constexpr int kMaxHeads = 4096;

// Element types of table rows. The service moves row bytes and never converts them.
enum class Dtype : uint8_t { kBf16, kF16, kF32, kF8E4M3, kNvfp4 };
std::string_view DtypeName(Dtype dtype);  // "bf16", "f16", "f32", "f8_e4m3", "nvfp4"
Result<Dtype> ParseDtype(std::string_view name);
// Bytes of one row of `head_dim` values: d * size, or d/2 code bytes + d/16 scale bytes for
// NVFP4. kInvalidArgument when NVFP4 and d is not a multiple of 16.
Result<uint64_t> RowBytes(Dtype dtype, int64_t head_dim);

class Layout {
 public:
  // Validates `config` (kInvalidArgument naming the field) and derives the layout.
  static Result<Layout> Create(const Config& config);

  const Config& config() const { return config_; }
  int ngram_size() const { return config_.ngram_size; }
  int num_heads() const { return static_cast<int>(head_sizes_.size()); }     // G
  int64_t head_dim() const { return config_.embed_dim / num_heads(); }       // d
  const std::vector<uint64_t>& multipliers() const { return multipliers_; }  // m_0..m_(N-1)
  const std::vector<uint64_t>& head_sizes() const { return head_sizes_; }
  const std::vector<uint64_t>& head_offsets() const { return head_offsets_; }
  const std::vector<FastMod>& head_mods() const { return head_mods_; }
  uint64_t used_rows() const { return used_rows_; }    // sum of head sizes
  uint64_t table_rows() const { return table_rows_; }  // used_rows rounded up to P

 private:
  Layout() = default;
  Config config_;
  std::vector<uint64_t> multipliers_;
  std::vector<uint64_t> head_sizes_;
  std::vector<uint64_t> head_offsets_;
  std::vector<FastMod> head_mods_;
  uint64_t used_rows_ = 0;
  uint64_t table_rows_ = 0;
};

}  // namespace ferry::embed
