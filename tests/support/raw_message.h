// Hand-packed message maps for tests that send what proto::encode never writes: an unknown
// version or type, or a field of the wrong type. Every message opens with its "v" and "type"
// entries; what follows them is the test's own.
#pragma once

#include <cstdint>
#include <string>

#include <msgpack.hpp>

namespace litellama::testing {

using RawPacker = msgpack::packer<msgpack::sbuffer>;

// A map of n_entries entries: "v" and "type" first, then the n_entries - 2 that `rest` packs.
template <typename Rest>
std::string pack_raw_message(uint32_t n_entries, uint32_t version, const std::string& type,
                             Rest&& rest) {
  msgpack::sbuffer buffer;
  RawPacker packer(buffer);
  packer.pack_map(n_entries);
  packer.pack(std::string("v"));
  packer.pack(version);
  packer.pack(std::string("type"));
  packer.pack(type);
  rest(packer);
  return std::string(buffer.data(), buffer.size());
}

// A map of only "v" and "type".
inline std::string pack_raw_message(uint32_t version, const std::string& type) {
  return pack_raw_message(2, version, type, [](RawPacker&) {});
}

}  // namespace litellama::testing
