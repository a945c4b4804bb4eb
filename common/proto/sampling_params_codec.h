// msgpack for SamplingParams (sampling_params.h): a map of its wire fields, as MSGPACK_DEFINE_MAP
// would write it (absent keys keep their defaults, unknown keys are ignored, a value of the
// wrong type throws msgpack::type_error). Written out here so that the type itself stays a plain
// struct that the device code can include without msgpack.
#pragma once

#include <msgpack.hpp>
#include <string_view>

#include "common/proto/sampling_params.h"

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
  namespace adaptor {

  template <>
  struct convert<litellama::proto::SamplingParams> {
    const msgpack::object& operator()(const msgpack::object& o,
                                      litellama::proto::SamplingParams& v) const {
      if (o.type != msgpack::type::MAP) throw msgpack::type_error();
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const msgpack::object_kv& kv = o.via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) continue;
        const std::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
        litellama::proto::for_each_sampling_field([&](std::string_view name, auto member) {
          if (key == name) kv.val.convert(v.*member);
        });
      }
      return o;
    }
  };

  template <>
  struct pack<litellama::proto::SamplingParams> {
    template <typename Stream>
    msgpack::packer<Stream>& operator()(msgpack::packer<Stream>& p,
                                        const litellama::proto::SamplingParams& v) const {
      p.pack_map(litellama::proto::kSamplingWireFields);
      litellama::proto::for_each_sampling_field([&](std::string_view name, auto member) {
        p.pack(name);
        p.pack(v.*member);
      });
      return p;
    }
  };

  template <>
  struct object_with_zone<litellama::proto::SamplingParams> {
    void operator()(msgpack::object::with_zone& o,
                    const litellama::proto::SamplingParams& v) const {
      const uint32_t n = litellama::proto::kSamplingWireFields;
      o.type = msgpack::type::MAP;
      o.via.map.size = n;
      o.via.map.ptr = static_cast<msgpack::object_kv*>(o.zone.allocate_align(
          sizeof(msgpack::object_kv) * n, MSGPACK_ZONE_ALIGNOF(msgpack::object_kv)));
      uint32_t i = 0;
      litellama::proto::for_each_sampling_field([&](std::string_view name, auto member) {
        o.via.map.ptr[i].key = msgpack::object(name, o.zone);
        o.via.map.ptr[i].val = msgpack::object(v.*member, o.zone);
        ++i;
      });
    }
  };

  }  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
