// Error-message building for the collator's files.
#pragma once

#include <sstream>
#include <string>

namespace odb::collate::internal {

// Message builder for errors. (Debian's absl has its own string_view, which
// absl::StrCat does not take from std::string_view; errors are off the hot
// path, so a stream is fine.)
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream out;
  out.precision(15);  // exact for integers, short for 0.1
  (out << ... << args);
  return out.str();
}

}  // namespace odb::collate::internal
