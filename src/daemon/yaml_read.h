// Reading one YAML value into a typed config field, with errors that name the
// field (the settings table, src/daemon/settings.cc, and collate.fields' items).
#ifndef ODB_DAEMON_YAML_READ_H_
#define ODB_DAEMON_YAML_READ_H_

#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "yaml-cpp/yaml.h"

namespace odb::config_internal {

template <typename T>
std::string FlowYaml(const T& value) {
  YAML::Emitter out;
  out << YAML::Flow << YAML::Node(value);
  return out.c_str();
}

// What a field of type T takes, for the error when a value does not read as
// one (a negative count, 1e30 for an integer, a word for a bool).
template <typename T>
std::string Expected() {
  if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::string("a whole number in ") + std::to_string(std::numeric_limits<T>::min()) + ".." +
           std::to_string(std::numeric_limits<T>::max());
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else {
    return "a list of strings";
  }
}

// `value` (absent: `out` keeps its default) read as a T into `out`.
template <typename T>
absl::Status ReadValue(const YAML::Node& value, const std::string& path, T& out) {
  if (!value) return absl::OkStatus();
  // A key without a value reads as YAML null, which a string field would
  // take as the text "null": every sample would then fail on it.
  if (value.IsNull()) {
    return absl::InvalidArgumentError("config field '" + path +
                                      "' has no value; give it one, or leave the key out for the default");
  }
  try {
    out = value.as<T>();
  } catch (const YAML::Exception&) {
    std::string text = YAML::Dump(value);
    if (text.size() > 64) text = text.substr(0, 64) + "... [" + std::to_string(text.size()) + " bytes]";
    return absl::InvalidArgumentError("config field '" + path + "': cannot read '" + text +
                                      "' as the expected type; use " + Expected<T>());
  }
  return absl::OkStatus();
}

template <typename E>
using Choices = std::vector<std::pair<std::string, E>>;

// The name of `value` among `choices` ("?" if none).
template <typename E>
std::string ChoiceName(const Choices<E>& choices, const E& value) {
  for (const auto& [name, v] : choices) {
    if (v == value) return name;
  }
  return "?";
}

// A value that must be one of `choices` (mapped to an enum).
template <typename E>
absl::Status ReadChoice(const YAML::Node& value, const std::string& path, const Choices<E>& choices, E& out) {
  if (!value) return absl::OkStatus();
  std::string text = ChoiceName(choices, out);
  if (absl::Status s = ReadValue(value, path, text); !s.ok()) return s;
  std::string allowed;
  for (const auto& [name, v] : choices) {
    if (name == text) {
      out = v;
      return absl::OkStatus();
    }
    allowed += (allowed.empty() ? "" : ", ") + name;
  }
  return absl::InvalidArgumentError("config field '" + path + "': '" + text + "' is not one of: " + allowed);
}

// A YAML mapping read key by key, remembering which keys were used so unknown
// keys (typos) can be reported with their full path.
class Section {
 public:
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  template <typename T>
  absl::Status Get(const std::string& key, T& out) {
    used_.insert(key);
    return ReadValue(node_[key], Path(key), out);
  }

  template <typename E>
  absl::Status GetEnum(const std::string& key, const Choices<E>& choices, E& out) {
    used_.insert(key);
    return ReadChoice(node_[key], Path(key), choices, out);
  }

  const YAML::Node& node() const { return node_; }
  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  absl::Status CheckNoUnknownKeys() const {
    if (!node_.IsMap()) return absl::OkStatus();
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (!used_.count(key)) {
        return absl::InvalidArgumentError("config: unknown field '" + Path(key) +
                                          "' (check the spelling; see docs/config.md)");
      }
    }
    return absl::OkStatus();
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::set<std::string> used_;
};

}  // namespace odb::config_internal

#endif  // ODB_DAEMON_YAML_READ_H_
