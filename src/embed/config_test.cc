#include "embed/config.h"

#include <gtest/gtest.h>

#include <random>

#include "ferry/embed.h"
#include "embed/primes.h"

namespace ferry::embed {
namespace {

TEST(SplitMix64, KnownValues) {
  // SplitMix64(0) is the first output of Vigna's splitmix64.c seeded with 0
  // (https://prng.di.unimi.it/splitmix64.c); the others were computed with Python integers.
  EXPECT_EQ(SplitMix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64(1), 0x910A2DEC89025CC1ull);
  EXPECT_EQ(SplitMix64(1234), 0xBB0CF61B2F181CDBull);
  EXPECT_EQ(SplitMix64(~0ull), 0xE4D971771B652C20ull);
}

TEST(Primes, IsPrimeSmallAndHard) {
  const uint64_t primes[] = {2,
                             3,
                             5,
                             37,
                             41,
                             20000003,
                             2305843009213693951ull /* 2^61-1 */,
                             18446744073709551557ull /* largest 64-bit prime */};
  for (uint64_t p : primes) EXPECT_TRUE(IsPrime(p)) << p;
  // 0, 1, squares, Carmichael numbers, and strong pseudoprimes to several bases
  // (3215031751 = 151 * 751 * 28351 passes bases 2, 3, 5 and 7).
  const uint64_t composites[] = {0,
                                 1,
                                 4,
                                 9,
                                 561,
                                 1105,
                                 20000001,
                                 3215031751ull,
                                 3825123056546413051ull,
                                 18446744073709551615ull};
  for (uint64_t c : composites) EXPECT_FALSE(IsPrime(c)) << c;
}

TEST(Primes, AgreesWithTrialDivision) {
  for (uint64_t n = 0; n < 5000; ++n) {
    bool prime = n >= 2;
    for (uint64_t d = 2; d * d <= n; ++d) prime = prime && n % d != 0;
    EXPECT_EQ(IsPrime(n), prime) << n;
  }
}

TEST(Primes, FromBase) {
  auto p = PrimesFrom(20000000, 5);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (std::vector<uint64_t>{20000003, 20000023, 20000033, 20000047, 20000059}));
  auto q = PrimesFrom(20000003, 2);  // the base itself counts when it is prime
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, (std::vector<uint64_t>{20000003, 20000023}));
  EXPECT_EQ(PrimesFrom(1ull << 63, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PrimesFrom(2, kMaxPrimesPerBase + 1).status().code(), Code::kInvalidArgument);
}

TEST(FastMod, MatchesDivision) {
  std::mt19937_64 rng(7);
  const uint64_t divisors[] = {1, 2, 3, 7, 20000003, 4294967311ull, (1ull << 63) + 29, ~0ull};
  for (uint64_t d : divisors) {
    FastMod f = FastMod::For(d);
    for (uint64_t x : std::initializer_list<uint64_t>{0, d - 1, d, d + 1, ~0ull, ~0ull - 1})
      EXPECT_EQ(f.Mod(x), x % d);
    for (int i = 0; i < 10000; ++i) {
      uint64_t x = rng();
      ASSERT_EQ(f.Mod(x), x % d) << x << " mod " << d;
    }
  }
}

TEST(Layout, ModelLayer0) {
  auto layout = Layout::Create(Config::Model(/*eos_id=*/1));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->num_heads(), 16);
  EXPECT_EQ(layout->head_dim(), 160);
  // Computed with Python integers from the specification.
  EXPECT_EQ(layout->multipliers(),
            (std::vector<uint64_t>{23703573157769ull, 20109073645365ull, 8052911324071ull}));
  EXPECT_EQ(layout->head_sizes()[0], 20000003u);
  EXPECT_EQ(layout->head_sizes()[15], 20000171u);
  EXPECT_EQ(layout->head_offsets()[0], 0u);
  EXPECT_EQ(layout->head_offsets()[1], 20000003u);
  EXPECT_EQ(layout->head_offsets()[2], 20000003u + 20000023u);
  EXPECT_EQ(layout->used_rows(), 320001446u);
  EXPECT_EQ(layout->table_rows(), 320001536u);
}

TEST(Layout, LaterLayerUsesLaterPrimesAndSeed) {
  auto layout = Layout::Create(Config::Model(1, /*layer=*/1));
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->head_sizes()[0], 20000213u);  // the 17th prime >= B
  EXPECT_EQ(layout->head_sizes()[3], 20000269u);  // the 20th
  EXPECT_EQ(layout->multipliers(),
            (std::vector<uint64_t>{3352040966061ull, 19752442147475ull, 10742103100073ull}));
}

TEST(Layout, LargestVocabulary) {
  Config c;
  c.vocab_size = 1ll << 31;  // half = floor((2^63-1) / 2^31 / 2) = 2^31 - 1
  c.eos_id = 0;
  c.ngram_size = 2;
  c.heads_per_ngram = 1;
  c.embed_dim = 4;
  c.base_vocab = 1;
  auto layout = Layout::Create(c);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->head_sizes()[0], 2u);  // primes >= 1 start at 2
  for (uint64_t m : layout->multipliers()) {
    EXPECT_EQ(m % 2, 1u);
    EXPECT_LT(m, 2 * ((1ull << 31) - 1));
  }
}

TEST(Layout, ValidationErrors) {
  const Config good = Config::Model(1);
  auto expect_invalid = [&](auto mutate, const char* what) {
    Config c = good;
    mutate(c);
    auto r = Layout::Create(c);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << what;
  };
  expect_invalid([](Config& c) { c.vocab_size = 0; }, "vocab 0");
  expect_invalid([](Config& c) { c.vocab_size = (1ll << 31) + 1; }, "vocab > 2^31");
  expect_invalid([](Config& c) { c.eos_id = -1; }, "eos < 0");
  expect_invalid([](Config& c) { c.eos_id = c.vocab_size; }, "eos = V");
  expect_invalid([](Config& c) { c.ngram_size = 1; }, "N = 1");
  expect_invalid([](Config& c) { c.ngram_size = kMaxNgram + 1; }, "N too large");
  expect_invalid([](Config& c) { c.heads_per_ngram = 0; }, "H = 0");
  expect_invalid([](Config& c) { c.embed_dim = 2561; }, "E not divisible");
  expect_invalid([](Config& c) { c.embed_dim = 0; }, "E = 0");
  expect_invalid([](Config& c) { c.base_vocab = 0; }, "B = 0");
  expect_invalid([](Config& c) { c.base_vocab = 1ull << 63; }, "B too large");
  expect_invalid([](Config& c) { c.row_padding = 0; }, "P = 0");
  expect_invalid([](Config& c) { c.layer = -1; }, "L < 0");
  expect_invalid([](Config& c) { c.layer = 1 << 20; }, "L too large");
  expect_invalid([](Config& c) { c.layer = 2147483647; }, "L = INT_MAX");
}

TEST(Dtype, RowBytes) {
  EXPECT_EQ(RowBytes(Dtype::kBf16, 160).value(), 320u);
  EXPECT_EQ(RowBytes(Dtype::kF16, 160).value(), 320u);
  EXPECT_EQ(RowBytes(Dtype::kF32, 160).value(), 640u);
  EXPECT_EQ(RowBytes(Dtype::kF8E4M3, 160).value(), 160u);
  EXPECT_EQ(RowBytes(Dtype::kNvfp4, 160).value(), 90u);  // 80 code bytes + 10 scale bytes
  EXPECT_EQ(RowBytes(Dtype::kNvfp4, 40).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseDtype("nvfp4").value(), Dtype::kNvfp4);
  EXPECT_EQ(ParseDtype("int8").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::embed
