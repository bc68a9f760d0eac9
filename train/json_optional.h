// std::optional <-> JSON for the configuration structs (nlohmann 3.11, Debian 12's, has no
// conversion of its own): an unset value is null, and null or a missing key reads back unset.
#pragma once
#include <optional>
#include <nlohmann/json.hpp>

namespace nlohmann {
template <class T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& v) {
    if (v)
      j = *v;
    else
      j = nullptr;
  }
  static void from_json(const json& j, std::optional<T>& v) {
    if (j.is_null())
      v.reset();
    else
      v = j.get<T>();
  }
};
}  // namespace nlohmann
