#include "base/codec.h"

#include <msgpack.hpp>

#include <string>

namespace ferry::codec {

struct Writer::Impl {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer{buffer};
};

Writer::Writer() : impl_(std::make_unique<Impl>()) {}
Writer::~Writer() = default;
void Writer::Array(uint32_t count) { impl_->packer.pack_array(count); }
void Writer::UInt(uint64_t v) { impl_->packer.pack_uint64(v); }
void Writer::Int(int64_t v) { impl_->packer.pack_int64(v); }
void Writer::Bool(bool v) { v ? impl_->packer.pack_true() : impl_->packer.pack_false(); }
void Writer::Str(std::string_view s) {
  impl_->packer.pack_str(static_cast<uint32_t>(s.size()));
  impl_->packer.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}
void Writer::Bin(std::string_view b) {
  impl_->packer.pack_bin(static_cast<uint32_t>(b.size()));
  impl_->packer.pack_bin_body(b.data(), static_cast<uint32_t>(b.size()));
}
std::string Writer::Take() {
  std::string out(impl_->buffer.data(), impl_->buffer.size());
  impl_->buffer.clear();
  return out;
}

namespace {
Status Malformed(std::string_view field, std::string_view what) {
  std::string msg = "malformed message: field '";
  msg += field;
  msg += "' ";
  msg += what;
  return Status(Code::kInvalidArgument, std::move(msg));
}
}  // namespace

Result<const void*> ArrayReader::NextItem(std::string_view field) {
  if (next_ >= size_) return Malformed(field, "is missing");
  return static_cast<const void*>(&static_cast<const msgpack::object*>(items_)[next_++]);
}

Result<uint64_t> ArrayReader::UInt(std::string_view field) {
  FERRY_ASSIGN_OR_RETURN(const void* item, NextItem(field));
  const auto* o = static_cast<const msgpack::object*>(item);
  if (o->type != msgpack::type::POSITIVE_INTEGER) return Malformed(field, "is not an unsigned integer");
  return o->via.u64;
}

Result<int64_t> ArrayReader::Int(std::string_view field) {
  FERRY_ASSIGN_OR_RETURN(const void* item, NextItem(field));
  const auto* o = static_cast<const msgpack::object*>(item);
  if (o->type == msgpack::type::NEGATIVE_INTEGER) return o->via.i64;
  if (o->type == msgpack::type::POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
    return static_cast<int64_t>(o->via.u64);
  return Malformed(field, "is not a signed integer");
}

Result<bool> ArrayReader::Bool(std::string_view field) {
  FERRY_ASSIGN_OR_RETURN(const void* item, NextItem(field));
  const auto* o = static_cast<const msgpack::object*>(item);
  if (o->type != msgpack::type::BOOLEAN) return Malformed(field, "is not a boolean");
  return o->via.boolean;
}

Result<std::string_view> ArrayReader::Bytes(std::string_view field, size_t max_bytes) {
  FERRY_ASSIGN_OR_RETURN(const void* item, NextItem(field));
  const auto* o = static_cast<const msgpack::object*>(item);
  if (o->type == msgpack::type::STR) {
    if (o->via.str.size > max_bytes) return Malformed(field, "is too long");
    return std::string_view(o->via.str.ptr, o->via.str.size);
  }
  if (o->type == msgpack::type::BIN) {
    if (o->via.bin.size > max_bytes) return Malformed(field, "is too long");
    return std::string_view(o->via.bin.ptr, o->via.bin.size);
  }
  return Malformed(field, "is not a string");
}

Result<ArrayReader> ArrayReader::Array(std::string_view field, size_t max_count) {
  FERRY_ASSIGN_OR_RETURN(const void* item, NextItem(field));
  const auto* o = static_cast<const msgpack::object*>(item);
  if (o->type != msgpack::type::ARRAY) return Malformed(field, "is not an array");
  if (o->via.array.size > max_count) return Malformed(field, "has too many elements");
  return ArrayReader(o->via.array.ptr, o->via.array.size);
}

struct Reader::Impl {
  msgpack::object_handle handle;
};

Reader::Reader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;
Reader::~Reader() = default;

ArrayReader Reader::root() const {
  const msgpack::object& o = impl_->handle.get();
  return ArrayReader(o.via.array.ptr, o.via.array.size);
}

Result<Reader> Reader::Parse(std::string_view bytes, const Limits& limits) {
  if (bytes.empty()) return Status(Code::kInvalidArgument, "malformed message: empty");
  if (bytes.size() > limits.max_bytes) {
    return Status(Code::kInvalidArgument, "malformed message: " + std::to_string(bytes.size()) +
                                              " bytes exceeds the limit of " +
                                              std::to_string(limits.max_bytes));
  }
  auto impl = std::make_unique<Impl>();
  size_t offset = 0;
  // msgpack-c++ reports malformed input by throwing; this is the one place it is caught.
  try {
    msgpack::unpack_limit limit(limits.max_array, limits.max_array, limits.max_str, limits.max_str,
                                limits.max_str, limits.max_depth);
    impl->handle = msgpack::unpack(bytes.data(), bytes.size(), offset, nullptr, nullptr, limit);
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument, std::string("malformed message: ") + e.what());
  }
  if (offset != bytes.size()) {
    return Status(Code::kInvalidArgument, "malformed message: trailing bytes");
  }
  if (impl->handle.get().type != msgpack::type::ARRAY) {
    return Status(Code::kInvalidArgument, "malformed message: top level is not an array");
  }
  return Reader(std::move(impl));
}

}  // namespace ferry::codec
