#include "embed/primes.h"

#include <map>
#include <string>

#include "base/mutex.h"

namespace ferry::embed {
namespace {

uint64_t MulMod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}

uint64_t PowMod(uint64_t base, uint64_t exp, uint64_t m) {
  uint64_t result = 1;
  base %= m;
  while (exp != 0) {
    if (exp & 1) result = MulMod(result, base, m);
    base = MulMod(base, base, m);
    exp >>= 1;
  }
  return result;
}

// One Miller-Rabin round: false when `a` proves n (odd, > 2) composite.
bool StrongProbablePrime(uint64_t n, uint64_t a, uint64_t d, int r) {
  uint64_t x = PowMod(a, d, n);
  if (x == 1 || x == n - 1) return true;
  for (int i = 1; i < r; ++i) {
    x = MulMod(x, x, n);
    if (x == n - 1) return true;
  }
  return false;
}

constexpr uint64_t kLimit = 1ull << 63;

}  // namespace

bool IsPrime(uint64_t n) {
  // The first 12 primes as bases decide every n < 3.3e24 (Sorenson and Webster, 2015), so all
  // 64-bit values.
  static constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  if (n < 2) return false;
  for (uint64_t p : kBases) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int r = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++r;
  }
  for (uint64_t a : kBases) {
    if (!StrongProbablePrime(n, a, d, r)) return false;
  }
  return true;
}

Result<std::vector<uint64_t>> PrimesFrom(uint64_t from, uint64_t count) {
  if (count > kMaxPrimesPerBase) {
    return Status(Code::kInvalidArgument, "asked for " + std::to_string(count) +
                                              " primes; at most " +
                                              std::to_string(kMaxPrimesPerBase) + " are served");
  }
  if (from >= kLimit) {
    return Status(Code::kInvalidArgument, "primes from " + std::to_string(from) + " exceed 2^63");
  }
  static Mutex mu;
  static auto* cache = new std::map<uint64_t, std::vector<uint64_t>>();  // leaked on purpose
  MutexLock lock(&mu);
  std::vector<uint64_t>& primes = (*cache)[from];
  uint64_t next = primes.empty() ? from : primes.back() + 1;
  while (primes.size() < count) {
    if (next >= kLimit) {
      return Status(Code::kInvalidArgument, "primes from " + std::to_string(from) + " exceed 2^63");
    }
    if (IsPrime(next)) primes.push_back(next);
    ++next;
  }
  return std::vector<uint64_t>(primes.begin(), primes.begin() + static_cast<ptrdiff_t>(count));
}

}  // namespace ferry::embed
