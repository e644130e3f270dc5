// libFuzzer target: the bounded msgpack reader (src/base/codec.h) under every decoder of ferry's
// messages and descriptors. The first byte picks small limits (so that each is reached), the
// rest is the message. Every input must be refused with kInvalidArgument or parse to a tree that
// keeps within the limits; the tree is walked with the typed reads the decoders use, written
// again with Writer, and the written bytes must parse to a tree that writes the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/codec.h"

namespace {

using ferry::codec::ArrayReader;
using ferry::codec::Limits;
using ferry::codec::Reader;
using ferry::codec::Writer;

// Writes the elements of `a` to `w`; false when an element is of a type that the typed reads do
// not cover (nil, float, map, ext), which decoders refuse as malformed.
bool Walk(ArrayReader a, const Limits& limits, size_t depth, Writer* w) {
  if (a.size() > limits.max_array || depth > limits.max_depth) __builtin_trap();
  w->Array(static_cast<uint32_t>(a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    // A failed typed read leaves the element consumed: try each type on a copy.
    ArrayReader c = a;
    if (auto u = c.UInt("u"); u.ok()) {
      w->UInt(*u);
      a = c;
      continue;
    }
    c = a;
    if (auto n = c.Int("i"); n.ok()) {
      if (*n >= 0) __builtin_trap();  // a non-negative one is an unsigned integer
      w->Int(*n);
      a = c;
      continue;
    }
    c = a;
    if (auto b = c.Bool("b"); b.ok()) {
      w->Bool(*b);
      a = c;
      continue;
    }
    c = a;
    if (auto s = c.Bytes("s", limits.max_str); s.ok()) {
      w->Str(*s);
      a = c;
      continue;
    }
    c = a;
    if (auto sub = c.Array("a", limits.max_array); sub.ok()) {
      if (!Walk(*sub, limits, depth + 1, w)) return false;
      a = c;
      continue;
    }
    return false;
  }
  // Past the end every read is refused.
  if (a.UInt("past").ok() || a.Bytes("past", 1).ok()) __builtin_trap();
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Limits limits;
  limits.max_array = 1 + (data[0] & 0x0f);      // 1 .. 16
  limits.max_str = 8u << ((data[0] >> 4) & 3);  // 8 .. 64
  limits.max_depth = 1 + (data[0] >> 6) * 2;    // 1 .. 7
  limits.max_bytes = 4096;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto r = Reader::Parse(bytes, limits);
  if (!r.ok()) {
    if (r.status().code() != ferry::Code::kInvalidArgument) __builtin_trap();
    return 0;
  }
  Writer w;
  if (!Walk(r->root(), limits, 1, &w)) return 0;
  const std::string once = w.Take();
  limits.max_bytes = once.size() + 1;
  auto again = Reader::Parse(once, limits);
  if (!again.ok()) __builtin_trap();
  Writer w2;
  if (!Walk(again->root(), limits, 1, &w2) || w2.Take() != once) __builtin_trap();
  // The same bytes with one more byte after them are refused (trailing bytes).
  if (Reader::Parse(once + '\0', limits).ok()) __builtin_trap();
  return 0;
}
