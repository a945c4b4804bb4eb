// Fuzz target: the safetensors header parser (services/worker/safetensors.h) on arbitrary file
// contents. Properties: parsing returns the entries or an error, never reads out of bounds (ASan
// watches the mapping's edges); every entry it accepts lies inside the file and holds exactly
// its shape's element count of its dtype.
#include <cstdint>
#include <string_view>

#include "common/mapped_file.h"
#include "services/worker/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = litellama::fuzz::scratch_dir() / "model.safetensors";
  litellama::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  auto file = litellama::MappedFile::open(path.string());
  if (!file.is_ok()) return 0;  // e.g. an empty file cannot be mapped
  auto entries = litellama::parse_safetensors(*file);
  if (!entries.is_ok()) return 0;
  for (const auto& e : *entries) {
    FUZZ_CHECK(e.offset_bytes <= size && e.size_bytes <= size - e.offset_bytes,
               "tensor '" + e.name + "' outside the file");
    // Overflow-checked element count: the accepted size must equal it.
    unsigned __int128 n = 1;
    for (int64_t d : e.shape) {
      FUZZ_CHECK(d >= 0, "negative dimension in '" + e.name + "'");
      n *= static_cast<unsigned __int128>(d);
      if (n > size) break;
    }
    FUZZ_CHECK(n * litellama::dtype_size_bytes(e.dtype) == e.size_bytes,
               "tensor '" + e.name + "' size does not match its shape and dtype");
    // Touch the first and last byte: must be inside the mapping.
    if (e.size_bytes > 0) {
      volatile uint8_t first = file->data()[e.offset_bytes];
      volatile uint8_t last = file->data()[e.offset_bytes + e.size_bytes - 1];
      (void)first;
      (void)last;
    }
  }
  return 0;
}
