// Internal: the names of an enum's values written once, as a table of spellings. The first row
// of a value is its name (NameOf, and the list KnownNames gives for an error message); later
// rows are other spellings that input may use (FindName).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace cortado::dist::internal {

template <class E>
struct Spelling {
  E value;
  const char* text;
};

// The name of `value`, or "?" for a value the table lacks.
template <class E, size_t N>
const char* NameOf(const Spelling<E> (&table)[N], E value) {
  for (const Spelling<E>& s : table) {
    if (s.value == value) return s.text;
  }
  return "?";
}

// The value `text` spells, if any.
template <class E, size_t N>
std::optional<E> FindName(const Spelling<E> (&table)[N], const std::string& text) {
  for (const Spelling<E>& s : table) {
    if (text == s.text) return s.value;
  }
  return std::nullopt;
}

// Every value's name, in table order: "f32, f16, bf16".
template <class E, size_t N>
std::string KnownNames(const Spelling<E> (&table)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (NameOf(table, table[i].value) != table[i].text) continue;  // another spelling
    out += (out.empty() ? "" : ", ") + std::string(table[i].text);
  }
  return out;
}

}  // namespace cortado::dist::internal
