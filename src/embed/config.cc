#include "embed/config.h"

#include <algorithm>
#include <optional>

#include "embed/checks.h"
#include "embed/names.h"
#include "embed/primes.h"

namespace ferry::embed {
namespace {

Status Invalid(std::string message) { return Status(Code::kInvalidArgument, std::move(message)); }

}  // namespace

Config Config::Model(int64_t eos_id, int layer) {
  Config c;
  c.vocab_size = 248320;
  c.eos_id = eos_id;
  c.ngram_size = 3;
  c.heads_per_ngram = 8;
  c.embed_dim = 2560;
  c.seed = 1234;
  c.base_vocab = 20'000'000;
  c.row_padding = 128;
  c.layer = layer;
  return c;
}

std::string Config::ToString() const {
  return "V=" + std::to_string(vocab_size) + " EOS=" + std::to_string(eos_id) +
         " N=" + std::to_string(ngram_size) + " H=" + std::to_string(heads_per_ngram) +
         " E=" + std::to_string(embed_dim) + " S=" + std::to_string(seed) +
         " B=" + std::to_string(base_vocab) + " P=" + std::to_string(row_padding) +
         " L=" + std::to_string(layer);
}

namespace {

constexpr NameTable<Dtype, 5> kDtypeNames = {{{Dtype::kBf16, "bf16"},
                                              {Dtype::kF16, "f16"},
                                              {Dtype::kF32, "f32"},
                                              {Dtype::kF8E4M3, "f8_e4m3"},
                                              {Dtype::kNvfp4, "nvfp4"}}};

}  // namespace

std::string_view DtypeName(Dtype dtype) { return NameOf(kDtypeNames, dtype); }

Result<Dtype> ParseDtype(std::string_view name) {
  if (std::optional<Dtype> d = ValueNamed(kDtypeNames, name)) return *d;
  return Invalid("unknown row dtype \"" + std::string(name) + "\" (" + NameList(kDtypeNames) +
                 ")");
}

Result<uint64_t> RowBytes(Dtype dtype, int64_t head_dim) {
  if (head_dim <= 0) return Invalid("head dim must be positive");
  uint64_t d = static_cast<uint64_t>(head_dim);
  switch (dtype) {
    case Dtype::kBf16:
    case Dtype::kF16:
      return 2 * d;
    case Dtype::kF32:
      return 4 * d;
    case Dtype::kF8E4M3:
      return d;
    case Dtype::kNvfp4:
      if (d % 16 != 0)
        return Invalid("nvfp4 rows need a head dim divisible by 16, not " + std::to_string(d));
      return d / 2 + d / 16;
  }
  return Invalid("unknown dtype");
}

Result<Layout> Layout::Create(const Config& c) {
  // Token ids are int32: V <= 2^31.
  FERRY_RETURN_IF_ERROR(CheckInRange("vocab_size", c.vocab_size, 1, int64_t{1} << 31));
  if (c.eos_id < 0 || c.eos_id >= c.vocab_size)
    return Invalid("eos_id " + std::to_string(c.eos_id) + " is outside the vocabulary [0, " +
                   std::to_string(c.vocab_size) + ")");
  FERRY_RETURN_IF_ERROR(CheckInRange("ngram_size", c.ngram_size, 2, kMaxNgram));
  FERRY_RETURN_IF_ERROR(CheckInRange("heads_per_ngram", c.heads_per_ngram, 1, kMaxHeads));
  const int64_t g = int64_t{c.ngram_size - 1} * c.heads_per_ngram;
  if (g > kMaxHeads)
    return Invalid("(ngram_size - 1) * heads_per_ngram = " + std::to_string(g) +
                   " heads; at most " + std::to_string(kMaxHeads));
  if (c.embed_dim <= 0 || c.embed_dim % g != 0)
    return Invalid("embed_dim " + std::to_string(c.embed_dim) +
                   " must be positive and divisible by the " + std::to_string(g) + " heads");
  if (c.base_vocab < 1) return Invalid("base_vocab must be at least 1");
  FERRY_RETURN_IF_ERROR(CheckInRange("row_padding", c.row_padding, 1, uint64_t{1} << 32));
  if (c.layer < 0 ||
      (static_cast<uint64_t>(c.layer) + 1) * static_cast<uint64_t>(g) > kMaxPrimesPerBase)
    return Invalid("layer " + std::to_string(c.layer) + " must be in [0, " +
                   std::to_string(kMaxPrimesPerBase / g) + ")");

  Layout layout;
  layout.config_ = c;
  const uint64_t v = static_cast<uint64_t>(c.vocab_size);
  const uint64_t half = std::max<uint64_t>(1, (0x7FFFFFFFFFFFFFFFull / v) / 2);
  const uint64_t layer = static_cast<uint64_t>(c.layer);
  for (int k = 0; k < c.ngram_size; ++k) {
    uint64_t x = c.seed + 10007 * layer + kGolden * static_cast<uint64_t>(k + 1);
    layout.multipliers_.push_back(2 * (SplitMix64(x) % half) + 1);
  }

  const uint64_t first_head = layer * static_cast<uint64_t>(g);
  FERRY_ASSIGN_OR_RETURN(std::vector<uint64_t> primes,
                         PrimesFrom(c.base_vocab, first_head + static_cast<uint64_t>(g)));
  uint64_t sum = 0;
  for (int64_t h = 0; h < g; ++h) {
    uint64_t size = primes[first_head + static_cast<uint64_t>(h)];
    layout.head_sizes_.push_back(size);
    layout.head_offsets_.push_back(sum);
    layout.head_mods_.push_back(FastMod::For(size));
    if (__builtin_add_overflow(sum, size, &sum)) return Invalid("table rows overflow 64 bits");
  }
  layout.used_rows_ = sum;
  uint64_t padded = (sum / c.row_padding + (sum % c.row_padding != 0));
  if (__builtin_mul_overflow(padded, c.row_padding, &layout.table_rows_))
    return Invalid("padded table rows overflow 64 bits");
  return layout;
}

}  // namespace ferry::embed
