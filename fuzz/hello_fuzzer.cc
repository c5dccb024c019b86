// Fuzz target: the alignment hello (src/align/hello.h), the first bytes
// daemons exchange at rendezvous. The input is split into one hello per rank
// (fuzz_util.h: SplitFrames) and checked together as CheckHellos does after
// the all-gather.
//
// Checks: no crash; the verdict does not depend on anything but the bytes
// (two calls agree); the error message stays bounded; and a well-formed set
// (every rank re-encoding rank 0's fields) is accepted.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/align/hello.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> frames = odb::fuzz::SplitFrames(data, size);
  std::vector<std::string> hellos(frames.begin(), frames.end());
  const absl::Status first = odb::align::CheckHellos(hellos);
  const absl::Status second = odb::align::CheckHellos(hellos);
  FUZZ_CHECK(first == second, "CheckHellos is not deterministic");
  if (hellos.empty()) return 0;
  FUZZ_CHECK(first.ok() || !first.message().empty(), "an error without a message");
  // Each problem names at most one rank's field and rank 0's: linear in the input.
  FUZZ_CHECK(first.message().size() <= 4096 + 64 * size, "error message out of proportion");

  // Fields taken from the input: a consistent world built from them passes.
  odb::align::HelloFields fields;
  for (size_t i = 0; i + 1 < frames.size(); i += 2) {
    fields.emplace_back(std::string(frames[i]), std::string(frames[i + 1]));
  }
  std::vector<std::string> world;
  for (size_t r = 0; r < hellos.size(); ++r) {
    world.push_back(odb::align::EncodeHello(static_cast<int>(r), static_cast<int>(hellos.size()), fields));
  }
  const absl::Status ok = odb::align::CheckHellos(world);
  FUZZ_CHECK(ok.ok(), "a consistent world is refused: " + std::string(ok.message()));
  return 0;
}
