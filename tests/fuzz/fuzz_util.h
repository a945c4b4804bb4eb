// Helpers shared by the libFuzzer targets of tests/fuzz/. Each target defines
// LLVMFuzzerTestOneInput; it is linked either with libFuzzer (LITELLAMA_FUZZ=ON, clang) or with
// replay_main.cpp, which runs it once over every committed corpus file and crash reproducer so
// that a fixed crash stays fixed in the ordinary test suites.
//
// What must stay true: a target checks properties that hold for every input (a parser returns an
// error or a value, never crashes; a value it returns is consistent); FUZZ_CHECK aborts, so a
// broken property is a crash that libFuzzer saves as a reproducer.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#define FUZZ_CHECK(cond, what)                                                                    \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "fuzz property broken at %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                                    \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

namespace litellama::fuzz {

// A private scratch directory for the process (removed at exit), for parsers that take a path.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base = std::filesystem::temp_directory_path();
    std::string tmpl = (base / "litellama-fuzz-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  FUZZ_CHECK(out.good(), "cannot write " + path.string());
}

// The repository root: LITELLAMA_SOURCE_DIR when set (ctest sets it), else the configured one.
inline std::string source_dir() {
  const char* env = std::getenv("LITELLAMA_SOURCE_DIR");
  return env != nullptr ? std::string(env) : std::string(LITELLAMA_FUZZ_SOURCE_DIR);
}

// Splits fuzz input into a few independent choices and the rest.
class Input {
 public:
  Input(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  uint8_t take_byte() {
    if (pos_ >= size_) return 0;
    return static_cast<uint8_t>(data_[pos_++]);
  }
  std::string_view rest() const { return std::string_view(data_ + pos_, size_ - pos_); }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace litellama::fuzz
