// Replays fuzz inputs through one target's LLVMFuzzerTestOneInput, so every
// seed and every crash ever found runs with the normal test suite (gcc, no
// libFuzzer). Usage: <test> DIR... ; runs every regular file under each DIR
// (recursively, sorted). A DIR that holds no file besides .keep is fine for
// regressions, but the first DIR (the corpus) must not be empty: that would
// mean the data did not reach the test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [REGRESSIONS_DIR...]\n", argv[0]);
    return 2;
  }
  for (int a = 1; a < argc; ++a) {
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (std::filesystem::recursive_directory_iterator it(argv[a], ec), end; !ec && it != end;
         it.increment(ec)) {
      if (it->is_regular_file() && it->path().filename() != ".keep") files.push_back(it->path());
    }
    if (ec) {
      std::fprintf(stderr, "cannot read %s: %s\n", argv[a], ec.message().c_str());
      return 2;
    }
    std::sort(files.begin(), files.end());
    if (a == 1 && files.empty()) {
      std::fprintf(stderr, "%s holds no inputs (is it in the test's data?)\n", argv[a]);
      return 2;
    }
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "running %s (%zu bytes)\n", path.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    }
    std::printf("%s: %zu inputs passed\n", argv[a], files.size());
  }
  return 0;
}
