// Names of the values of the embedding layer's small enums (Dtype, UvaMode, Phase): one table
// per enum serves both directions (value to name, name to value) and the list of names an
// error message offers, so that no name is added to one and missed in another.
//
// Thread safety: constant tables and pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ferry::embed {

template <typename E, size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;

// The name of `value`; "?" when the table lacks it.
template <typename E, size_t N>
constexpr std::string_view NameOf(const NameTable<E, N>& table, E value) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "?";
}

// The value named `name`; nullopt when none is.
template <typename E, size_t N>
constexpr std::optional<E> ValueNamed(const NameTable<E, N>& table, std::string_view name) {
  for (const auto& [v, n] : table)
    if (n == name) return v;
  return std::nullopt;
}

// The names in table order, for a message: "a, b or c".
template <typename E, size_t N>
std::string NameList(const NameTable<E, N>& table) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out += table[i].second;
  }
  return out;
}

}  // namespace ferry::embed
