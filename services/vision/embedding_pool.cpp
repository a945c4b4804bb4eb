// EmbeddingPool on Boost.Interprocess shared memory. Region layout (every offset 64-byte
// aligned): [RegionHeader][slot 0 rows][slot 1 rows]... (a device pool: the header alone, its rows
// laid out the same way in the device allocation); a slot's rows are rows_per_slot * hidden
// float32, padded with whole rows up to the fewest that make a multiple of 64 bytes. So every slot
// starts on a cache line and also a whole number of rows after slot 0's first row, which lets a
// reader name any row of the pool by one index (row_index) counted from rows(0).data().
#include "services/vision/embedding_pool.h"

#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

namespace litellama {

namespace bip = boost::interprocess;

namespace {

constexpr uint64_t kEmbeddingPoolMagic = 0x4c4c4d454d425031ull;  // "LLMEMBP1"
constexpr uint32_t kEmbeddingPoolLayoutVersion = 4;
constexpr size_t kAlign = 64;
// The largest region create() makes or open() accepts: 1 TiB, far above any real pool, and small
// enough that every size computation below stays exact in 64 bits.
constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 40;

static_assert(sizeof(size_t) >= sizeof(uint64_t), "the region size must fit in size_t");

// Written once by create() before the name is announced; never changed afterwards.
struct RegionHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t on_device;  // 1: the rows are in device memory (ipc_handle, device_uuid)
  int32_t n_slots;
  int32_t rows_per_slot;
  int32_t hidden;
  int32_t reserved1;
  uint64_t incarnation;
  uint8_t ipc_handle[64];
  uint8_t device_uuid[16];
  uint8_t ready_event[64];
  uint64_t finished_ns_offset;
};

constexpr uint64_t align_up(uint64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

constexpr uint64_t kRowsOffset = align_up(sizeof(RegionHeader));

// Rows from one slot's first row to the next slot's: rows_per_slot rounded up to a multiple of
// 16 / gcd(hidden, 16), the fewest rows whose bytes (hidden * 4 each) are a multiple of 64. At most
// 15 rows of padding; none when hidden is a multiple of 16. Exact in 64 bits for any int32 sizes.
uint64_t slot_stride_rows(const EmbeddingPoolGeometry& g) {
  const auto hidden = static_cast<uint64_t>(g.hidden);
  const uint64_t multiple = kAlign / sizeof(float) / std::gcd(hidden, kAlign / sizeof(float));
  return (static_cast<uint64_t>(g.rows_per_slot) + multiple - 1) / multiple * multiple;
}

// Bytes from one slot's first row to the next slot's; valid once check_geometry passed.
uint64_t slot_stride_bytes(const EmbeddingPoolGeometry& g) {
  return slot_stride_rows(g) * static_cast<uint64_t>(g.hidden) * sizeof(float);
}

uint64_t region_bytes(const EmbeddingPoolGeometry& g, bool on_device) {
  return kRowsOffset + (on_device ? 0 : static_cast<uint64_t>(g.n_slots) * slot_stride_bytes(g));
}

// Every factor is positive and the region is at most kMaxRegionBytes. Each step divides before
// it multiplies, so no intermediate product can overflow.
Status check_geometry(const EmbeddingPoolGeometry& g) {
  if (g.n_slots <= 0 || g.rows_per_slot <= 0 || g.hidden <= 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "embedding pool geometry must be positive (slots {}, rows per slot {}, "
                      "hidden {})",
                      g.n_slots, g.rows_per_slot, g.hidden);
  }
  // slot_stride_rows * hidden < (2^31 + 16) * 2^31 < 2^63: exact in 64 bits; the product with
  // sizeof(float) is taken only once it is known to be at most the budget.
  const uint64_t floats = slot_stride_rows(g) * static_cast<uint64_t>(g.hidden);
  const uint64_t budget = kMaxRegionBytes - kRowsOffset;
  if (floats > budget / sizeof(float) ||
      floats * sizeof(float) > budget / static_cast<uint64_t>(g.n_slots)) {
    return make_error(StatusCode::kInvalidArgument,
                      "embedding pool of {} slots x {} rows x {} floats exceeds {} bytes",
                      g.n_slots, g.rows_per_slot, g.hidden, kMaxRegionBytes);
  }
  return Status::ok();
}

}  // namespace

struct EmbeddingPool::Impl {
  bip::shared_memory_object shm;
  bip::mapped_region region;
};

EmbeddingPool::EmbeddingPool(std::string name, bool owner, std::unique_ptr<Impl> impl,
                             EmbeddingPoolGeometry geometry, uint64_t incarnation)
    : name_(std::move(name)),
      owner_(owner),
      impl_(std::move(impl)),
      geometry_(geometry),
      incarnation_(incarnation) {}

EmbeddingPool::~EmbeddingPool() {
  impl_.reset();
  if (owner_) bip::shared_memory_object::remove(name_.c_str());
}

void EmbeddingPool::remove(const std::string& name) {
  bip::shared_memory_object::remove(name.c_str());
}

uint64_t EmbeddingPool::rows_bytes(const EmbeddingPoolGeometry& geometry) {
  if (!check_geometry(geometry)) return 0;
  return static_cast<uint64_t>(geometry.n_slots) * slot_stride_bytes(geometry);
}

Result<std::unique_ptr<EmbeddingPool>> EmbeddingPool::create(const std::string& name,
                                                             const EmbeddingPoolGeometry& geometry,
                                                             uint64_t incarnation,
                                                             const EmbeddingPoolDevice* device) {
  LITELLAMA_RETURN_IF_ERROR(check_geometry(geometry));
  const bool on_device = device != nullptr;
  try {
    bip::shared_memory_object::remove(name.c_str());
    auto impl = std::make_unique<Impl>();
    // 0600: the rows are derived from users' images; only the service user's processes (the
    // vision service and the worker) may map them. Boost sets the mode with fchmod, past the umask.
    impl->shm = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write,
                                          bip::permissions(0600));
    const uint64_t size = region_bytes(geometry, on_device);
    impl->shm.truncate(static_cast<bip::offset_t>(size));
    impl->region = bip::mapped_region(impl->shm, bip::read_write);
    // A freshly created object reads as zeros (POSIX ftruncate), so only the header is written:
    // the rows' pages are not touched until an image is encoded into them.
    auto* header = static_cast<RegionHeader*>(impl->region.get_address());
    *header = RegionHeader{};
    header->n_slots = geometry.n_slots;
    header->rows_per_slot = geometry.rows_per_slot;
    header->hidden = geometry.hidden;
    header->incarnation = incarnation;
    if (on_device) {
      header->on_device = 1;
      std::memcpy(header->ipc_handle, device->ipc_handle.data(), sizeof header->ipc_handle);
      std::memcpy(header->device_uuid, device->device_uuid.data(), sizeof header->device_uuid);
      std::memcpy(header->ready_event, device->ready_event.data(), sizeof header->ready_event);
      header->finished_ns_offset = device->finished_ns_offset;
    }
    header->layout_version = kEmbeddingPoolLayoutVersion;
    header->magic = kEmbeddingPoolMagic;
    std::unique_ptr<EmbeddingPool> pool(
        new EmbeddingPool(name, true, std::move(impl), geometry, incarnation));
    pool->on_device_ = on_device;
    if (on_device) pool->device_ = *device;
    return pool;
  } catch (const std::exception& e) {
    bip::shared_memory_object::remove(name.c_str());
    return make_error(StatusCode::kResourceExhausted,
                      "cannot create embedding pool shared memory '{}' ({} bytes): {}", name,
                      region_bytes(geometry, on_device), e.what());
  }
}

Result<std::unique_ptr<EmbeddingPool>> EmbeddingPool::open(const std::string& name,
                                                           uint64_t incarnation) {
  try {
    auto impl = std::make_unique<Impl>();
    impl->shm = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
    impl->region = bip::mapped_region(impl->shm, bip::read_write);
    if (impl->region.get_size() < sizeof(RegionHeader)) {
      return make_error(StatusCode::kDataLoss, "embedding pool shared memory '{}' is too small",
                        name);
    }
    const RegionHeader header = *static_cast<const RegionHeader*>(impl->region.get_address());
    if (header.magic != kEmbeddingPoolMagic ||
        header.layout_version != kEmbeddingPoolLayoutVersion) {
      return make_error(StatusCode::kUnsupported,
                        "shared memory '{}' is not an embedding pool v{} (magic {:#x}, version {})",
                        name, kEmbeddingPoolLayoutVersion, header.magic, header.layout_version);
    }
    const EmbeddingPoolGeometry geometry{header.n_slots, header.rows_per_slot, header.hidden};
    LITELLAMA_RETURN_IF_ERROR(check_geometry(geometry));
    if (header.on_device > 1) {
      return make_error(StatusCode::kDataLoss, "embedding pool '{}' has memory kind {}", name,
                        header.on_device);
    }
    const bool on_device = header.on_device == 1;
    if (impl->region.get_size() < region_bytes(geometry, on_device)) {
      return make_error(StatusCode::kDataLoss,
                        "embedding pool shared memory '{}' is smaller than its layout ({} < {} "
                        "bytes)",
                        name, impl->region.get_size(), region_bytes(geometry, on_device));
    }
    // A pool of another vision process (a stale region, or a restart the caller has not heard of
    // yet): its slot numbering is not the one the caller's scheduler assigned.
    if (incarnation != 0 && header.incarnation != incarnation) {
      return make_error(StatusCode::kUnavailable,
                        "embedding pool '{}' belongs to vision incarnation {}, expected {}", name,
                        header.incarnation, incarnation);
    }
    std::unique_ptr<EmbeddingPool> pool(
        new EmbeddingPool(name, false, std::move(impl), geometry, header.incarnation));
    pool->on_device_ = on_device;
    if (on_device) {
      std::memcpy(pool->device_.ipc_handle.data(), header.ipc_handle, sizeof header.ipc_handle);
      std::memcpy(pool->device_.device_uuid.data(), header.device_uuid, sizeof header.device_uuid);
      std::memcpy(pool->device_.ready_event.data(), header.ready_event, sizeof header.ready_event);
      pool->device_.finished_ns_offset = header.finished_ns_offset;
    }
    return pool;
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::not_found_error) {
      return make_error(StatusCode::kNotFound, "embedding pool shared memory '{}' does not exist",
                        name);
    }
    return make_error(StatusCode::kUnavailable, "cannot open embedding pool shared memory '{}': {}",
                      name, e.what());
  } catch (const std::exception& e) {
    return make_error(StatusCode::kUnavailable, "cannot open embedding pool shared memory '{}': {}",
                      name, e.what());
  }
}

std::span<float> EmbeddingPool::rows(int32_t slot) {
  if (on_device_ || slot < 0 || slot >= geometry_.n_slots) return {};
  auto* base = static_cast<uint8_t*>(impl_->region.get_address()) + kRowsOffset +
               static_cast<size_t>(slot) * slot_stride_bytes(geometry_);
  return {reinterpret_cast<float*>(base),
          static_cast<size_t>(geometry_.rows_per_slot) * static_cast<size_t>(geometry_.hidden)};
}

std::span<const float> EmbeddingPool::rows(int32_t slot) const {
  return const_cast<EmbeddingPool*>(this)->rows(slot);
}

int64_t EmbeddingPool::row_index(int32_t slot, int32_t row) const {
  if (slot < 0 || slot >= geometry_.n_slots || row < 0 || row >= geometry_.rows_per_slot) {
    return -1;
  }
  // Below 2^40 / 4 rows, as the region is at most kMaxRegionBytes: no overflow.
  return static_cast<int64_t>(static_cast<uint64_t>(slot) * slot_stride_rows(geometry_)) + row;
}

size_t EmbeddingPool::size_bytes() const {
  return region_bytes(geometry_, false);
}

}  // namespace litellama
