// A read-only memory mapping of a whole file. Checkpoint tensors are read in place from it, so
// loading a model costs no copy until the backend converts or uploads the weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace litellama {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_bytes_ = 0;
  std::string path_;
};

// Reads a whole (small) file into a string.
Result<std::string> read_text_file(const std::string& path);

}  // namespace litellama
