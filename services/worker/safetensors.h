// The safetensors format: an 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets}, then the tensor bytes. Parsing checks every offset
// against the file so a truncated or corrupt file is an error, never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "common/status.h"

namespace litellama {

// What every tensor of a checkpoint has, whether it is read (SafetensorsEntry, TensorView) or
// written (SafetensorsTensor).
struct TensorMeta {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

struct SafetensorsEntry : TensorMeta {
  size_t offset_bytes = 0;  // from the start of the file
  size_t size_bytes = 0;
};

// Parses the header of a mapped safetensors file.
Result<std::vector<SafetensorsEntry>> parse_safetensors(const MappedFile& file);

// A tensor to write: `data` holds shape's element count of `dtype`.
struct SafetensorsTensor : TensorMeta {
  std::vector<uint8_t> data;
};

// Writes tensors (in the given order, contiguous) with the header padded to 8 bytes.
Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors);

}  // namespace litellama
