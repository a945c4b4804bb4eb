#include "services/worker/safetensors.h"

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

namespace litellama {

using nlohmann::json;

Result<std::vector<SafetensorsEntry>> parse_safetensors(const MappedFile& file) {
  const std::string& path = file.path();
  if (file.size_bytes() < 8) {
    return make_error(StatusCode::kDataLoss, "'{}': truncated safetensors file ({} bytes)", path,
                      file.size_bytes());
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file.data()[i];
  if (header_len > file.size_bytes() - 8) {
    return make_error(StatusCode::kDataLoss,
                      "'{}': safetensors header of {} bytes does not fit the {}-byte file "
                      "(truncated or not a safetensors file)",
                      path, header_len, file.size_bytes());
  }
  const char* begin = reinterpret_cast<const char*>(file.data() + 8);
  json header = json::parse(begin, begin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return make_error(StatusCode::kDataLoss, "'{}': safetensors header is not a JSON object", path);
  }
  const size_t data_start = 8 + header_len;
  const size_t data_size = file.size_bytes() - data_start;
  std::vector<SafetensorsEntry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& t = it.value();
    SafetensorsEntry e;
    e.name = it.key();
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return make_error(StatusCode::kDataLoss, "'{}': malformed header entry for tensor '{}'", path,
                        e.name);
    }
    auto dtype = dtype_from_safetensors_name(t["dtype"].get<std::string>());
    if (!dtype) {
      return make_error(StatusCode::kUnsupported, "'{}': tensor '{}' has unsupported dtype '{}'",
                        path, e.name, t["dtype"].get<std::string>());
    }
    e.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
        return make_error(StatusCode::kDataLoss, "'{}': tensor '{}' has a bad shape", path, e.name);
      }
      const auto dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t{1} << 62) / dim) {
        return make_error(StatusCode::kDataLoss, "'{}': tensor '{}' shape overflows", path, e.name);
      }
      e.shape.push_back(static_cast<int64_t>(dim));
      numel *= dim;
    }
    const json& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return make_error(StatusCode::kDataLoss, "'{}': tensor '{}' has bad data_offsets", path,
                        e.name);
    }
    const auto b = off[0].get<uint64_t>();
    const auto end = off[1].get<uint64_t>();
    if (b > end || end > data_size) {
      return make_error(StatusCode::kDataLoss,
                        "'{}': tensor '{}' lies outside the file (bytes {}..{} of {}): the file "
                        "is truncated or corrupt",
                        path, e.name, b, end, data_size);
    }
    if (end - b != numel * dtype_size_bytes(e.dtype)) {
      return make_error(StatusCode::kDataLoss,
                        "'{}': tensor '{}' has {} bytes but its shape and dtype need {}", path,
                        e.name, end - b, numel * dtype_size_bytes(e.dtype));
    }
    e.offset_bytes = data_start + b;
    e.size_bytes = end - b;
    entries.push_back(std::move(e));
  }
  return entries;
}

Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors) {
  json header = json::object();
  size_t offset = 0;
  for (const auto& t : tensors) {
    size_t numel = 1;
    for (auto d : t.shape) numel *= static_cast<size_t>(d);
    if (numel * dtype_size_bytes(t.dtype) != t.data.size()) {
      return make_error(StatusCode::kInvalidArgument, "tensor '{}': data size does not match shape",
                        t.name);
    }
    header[t.name] = {{"dtype", dtype_safetensors_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(StatusCode::kInvalidArgument, "cannot write '{}'", path);
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size()));
  }
  out.close();
  if (!out) return make_error(StatusCode::kInternal, "failed writing '{}'", path);
  return Status::ok();
}

}  // namespace litellama
