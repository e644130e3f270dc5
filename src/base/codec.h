// A bounded msgpack codec for everything ferry puts on a wire or in a descriptor.
//
// Writer packs values in order. Reader decodes bytes from outside: it enforces size, count and
// depth limits before allocating, checks every type, and reports malformed input as
// kInvalidArgument. It is the one place where msgpack-c++'s exceptions are caught.
//
// Thread safety: values; one object per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::codec {

class Writer {
 public:
  Writer();
  ~Writer();
  void Array(uint32_t count);
  void UInt(uint64_t v);
  void Int(int64_t v);
  void Str(std::string_view s);
  void Bin(std::string_view bytes);
  void Bool(bool v);
  std::string Take();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct Limits {
  size_t max_bytes = 64 * 1024;
  size_t max_array = 4096;
  size_t max_str = 64 * 1024;
  size_t max_depth = 8;
};

// A position inside a decoded array: fields are read in order with their expected types.
class ArrayReader {
 public:
  // Number of elements in the array.
  size_t size() const { return size_; }
  bool done() const { return next_ >= size_; }
  Result<uint64_t> UInt(std::string_view field);
  Result<int64_t> Int(std::string_view field);
  Result<bool> Bool(std::string_view field);
  // A str or bin of at most `max_bytes`.
  Result<std::string_view> Bytes(std::string_view field, size_t max_bytes);
  Result<ArrayReader> Array(std::string_view field, size_t max_count);

 private:
  friend class Reader;
  ArrayReader(const void* items, size_t size) : items_(items), size_(size) {}
  // The next element, as a `const msgpack::object*`.
  Result<const void*> NextItem(std::string_view field);
  const void* items_ = nullptr;  // msgpack::object[size_], owned by the Reader
  size_t size_ = 0;
  size_t next_ = 0;
};

// Owns the decoded form of one message whose top level is an array.
class Reader {
 public:
  static Result<Reader> Parse(std::string_view bytes, const Limits& limits = {});
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  ~Reader();
  ArrayReader root() const;

 private:
  struct Impl;
  explicit Reader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::codec
