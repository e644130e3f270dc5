// Little-endian loads and stores of fixed-width integers at unaligned byte addresses: the one
// codec for every fixed-layout wire format and file header ferry reads or writes (the ucx and
// shm message headers, the staged piece tables, the shm ring's records, handshake prefixes).
// The byte order on the wire is little-endian whatever the host's: on a little-endian host
// each call is one unaligned move; on a big-endian host the bytes are swapped.
//
// `p` may point at any byte type (std::byte, char, unsigned char, uint8_t) and need not be
// aligned. REQUIRES: `p` points at N/8 readable (Load) or writable (Store) bytes.
//
// Thread safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ferry {
namespace endian_internal {

template <typename T>
concept ByteType = std::is_same_v<std::remove_const_t<T>, std::byte> || std::is_same_v<std::remove_const_t<T>, char> ||
                   std::is_same_v<std::remove_const_t<T>, unsigned char>;

template <typename U>
constexpr U ToLittle(U v) {
  if constexpr (std::endian::native == std::endian::little) {
    return v;
  } else if constexpr (sizeof(U) == 2) {
    return static_cast<U>(__builtin_bswap16(v));
  } else if constexpr (sizeof(U) == 4) {
    return static_cast<U>(__builtin_bswap32(v));
  } else {
    return static_cast<U>(__builtin_bswap64(v));
  }
}

template <typename U, typename B>
inline U Load(const B* p) {
  U v;
  std::memcpy(&v, p, sizeof(v));
  return ToLittle(v);  // a swap is its own inverse
}

template <typename U, typename B>
inline void Store(B* p, U v) {
  v = ToLittle(v);
  std::memcpy(p, &v, sizeof(v));
}

}  // namespace endian_internal

template <endian_internal::ByteType B>
inline uint16_t LoadLe16(const B* p) { return endian_internal::Load<uint16_t>(p); }
template <endian_internal::ByteType B>
inline uint32_t LoadLe32(const B* p) { return endian_internal::Load<uint32_t>(p); }
template <endian_internal::ByteType B>
inline uint64_t LoadLe64(const B* p) { return endian_internal::Load<uint64_t>(p); }

template <endian_internal::ByteType B>
inline void StoreLe16(B* p, uint16_t v) { endian_internal::Store(p, v); }
template <endian_internal::ByteType B>
inline void StoreLe32(B* p, uint32_t v) { endian_internal::Store(p, v); }
template <endian_internal::ByteType B>
inline void StoreLe64(B* p, uint64_t v) { endian_internal::Store(p, v); }

}  // namespace ferry
