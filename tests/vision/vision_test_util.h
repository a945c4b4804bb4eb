// Helpers of the vision tests: the committed test images and reference files.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace litellama::vision::test {

inline std::string source_dir() {
  const char* env = std::getenv("LITELLAMA_SOURCE_DIR");
  return env && *env ? env : LITELLAMA_TEST_SOURCE_DIR;
}

inline std::filesystem::path images_dir() {
  return std::filesystem::path(source_dir()) / "tests/golden/images";
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

}  // namespace litellama::vision::test
