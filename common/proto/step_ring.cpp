#include "common/proto/step_ring.h"

#include <cstring>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

namespace litellama::proto {

namespace bip = boost::interprocess;

namespace {

struct RegionHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t reserved;
  StepRingLimits limits;
};

constexpr size_t kAlign = 64;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// Byte offsets of each array inside one buffer; the same function on both sides.
struct BufferLayout {
  size_t header, token_ids, positions, token_start, kv_len, slot_start, new_slot_start, new_slots,
      sample, sampling, n_generated, history_start, history_ids, n_prompt, sampled_ids, top_ids,
      top_values, logprobs, lse, image_start, image_slot, image_pos, size;
};

BufferLayout buffer_layout(const StepRingLimits& l) {
  BufferLayout b{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = at;
    at = align_up(at + bytes);
    return offset;
  };
  const size_t t = static_cast<size_t>(l.max_tokens), s = static_cast<size_t>(l.max_seqs);
  b.header = take(sizeof(StepHeader));
  b.token_ids = take(t * 4);
  b.positions = take(t * 4);
  b.token_start = take((s + 1) * 4);
  b.kv_len = take(s * 4);
  b.slot_start = take(s * 4);
  b.new_slot_start = take((s + 1) * 4);
  b.new_slots = take(static_cast<size_t>(l.max_slots) * 4);
  b.sample = take(s);
  b.sampling = take(s * sizeof(SamplingParams));
  b.n_generated = take(s * 4);
  b.history_start = take((s + 1) * 4);
  b.history_ids = take(static_cast<size_t>(l.max_history) * 4);
  b.n_prompt = take(s * 4);
  b.sampled_ids = take(s * 4);
  b.top_ids = take(s * kMaxStepTopLogits * 4);
  b.top_values = take(s * kMaxStepTopLogits * 4);
  b.logprobs = take(s * 4);
  b.lse = take(s * 4);
  b.image_start = take((s + 1) * 4);
  b.image_slot = take(static_cast<size_t>(l.max_images) * 4);
  b.image_pos = take(static_cast<size_t>(l.max_images) * 4);
  b.size = at;
  return b;
}

size_t region_size(const StepRingLimits& l) {
  return align_up(sizeof(RegionHeader)) + kStepRingBuffers * buffer_layout(l).size;
}

Status check_limits(const StepRingLimits& l) {
  constexpr int32_t kMax = 1 << 26;
  if (l.max_tokens <= 0 || l.max_seqs <= 0 || l.max_slots <= 0 || l.max_history < 0 ||
      l.max_images < 0 || l.max_images > kMax || l.max_tokens > kMax || l.max_seqs > kMax ||
      l.max_slots > kMax || l.max_history > kMax || l.table_capacity < l.max_slots ||
      l.table_capacity > INT32_MAX) {
    return make_error(StatusCode::kInvalidArgument,
                      "step ring limits out of range (tokens {}, seqs {}, slots {}, history {}, "
                      "table {})",
                      l.max_tokens, l.max_seqs, l.max_slots, l.max_history, l.table_capacity);
  }
  return Status::ok();
}

}  // namespace

struct StepRing::Impl {
  bip::shared_memory_object shm;
  bip::mapped_region region;
};

StepRing::StepRing(std::string name, bool owner, std::unique_ptr<Impl> impl, StepRingLimits limits)
    : name_(std::move(name)), owner_(owner), impl_(std::move(impl)), limits_(limits) {}

StepRing::~StepRing() {
  impl_.reset();
  if (owner_) bip::shared_memory_object::remove(name_.c_str());
}

void StepRing::remove(const std::string& name) {
  bip::shared_memory_object::remove(name.c_str());
}

Result<std::unique_ptr<StepRing>> StepRing::create(const std::string& name,
                                                   const StepRingLimits& limits) {
  LITELLAMA_RETURN_IF_ERROR(check_limits(limits));
  try {
    bip::shared_memory_object::remove(name.c_str());
    auto impl = std::make_unique<Impl>();
    // 0600: the ring carries every prompt's token ids; only the service user's processes (the
    // worker and the scheduler) may map it. Boost sets the mode with fchmod, past the umask.
    impl->shm = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write,
                                          bip::permissions(0600));
    const size_t size = region_size(limits);
    impl->shm.truncate(static_cast<bip::offset_t>(size));
    impl->region = bip::mapped_region(impl->shm, bip::read_write);
    std::memset(impl->region.get_address(), 0, size);
    auto* header = static_cast<RegionHeader*>(impl->region.get_address());
    header->limits = limits;
    header->layout_version = kStepRingLayoutVersion;
    header->magic = kStepRingMagic;
    return std::unique_ptr<StepRing>(new StepRing(name, true, std::move(impl), limits));
  } catch (const std::exception& e) {
    bip::shared_memory_object::remove(name.c_str());
    return make_error(StatusCode::kResourceExhausted, "cannot create shared memory '{}': {}", name,
                      e.what());
  }
}

Result<std::unique_ptr<StepRing>> StepRing::open(const std::string& name) {
  try {
    auto impl = std::make_unique<Impl>();
    impl->shm = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
    impl->region = bip::mapped_region(impl->shm, bip::read_write);
    if (impl->region.get_size() < sizeof(RegionHeader)) {
      return make_error(StatusCode::kDataLoss, "shared memory '{}' is too small", name);
    }
    const auto* header = static_cast<const RegionHeader*>(impl->region.get_address());
    if (header->magic != kStepRingMagic || header->layout_version != kStepRingLayoutVersion) {
      return make_error(StatusCode::kUnsupported, "shared memory '{}' is not a step ring v{}", name,
                        kStepRingLayoutVersion);
    }
    const StepRingLimits limits = header->limits;
    LITELLAMA_RETURN_IF_ERROR(check_limits(limits));
    if (impl->region.get_size() < region_size(limits)) {
      return make_error(StatusCode::kDataLoss, "shared memory '{}' is smaller than its layout",
                        name);
    }
    return std::unique_ptr<StepRing>(new StepRing(name, false, std::move(impl), limits));
  } catch (const std::exception& e) {
    return make_error(StatusCode::kUnavailable, "cannot open shared memory '{}': {}", name,
                      e.what());
  }
}

size_t StepRing::size_bytes() const {
  return region_size(limits_);
}

void* StepRing::data() const {
  return impl_->region.get_address();
}

StepView StepRing::buffer(int index) {
  const BufferLayout b = buffer_layout(limits_);
  auto* base = static_cast<uint8_t*>(impl_->region.get_address()) + align_up(sizeof(RegionHeader)) +
               static_cast<size_t>(index) * b.size;
  const size_t t = static_cast<size_t>(limits_.max_tokens);
  const size_t s = static_cast<size_t>(limits_.max_seqs);
  auto i32 = [&](size_t offset, size_t n) {
    return std::span<int32_t>(reinterpret_cast<int32_t*>(base + offset), n);
  };
  StepView v;
  v.header = reinterpret_cast<StepHeader*>(base + b.header);
  v.token_ids = i32(b.token_ids, t);
  v.positions = i32(b.positions, t);
  v.token_start = i32(b.token_start, s + 1);
  v.kv_len = i32(b.kv_len, s);
  v.slot_start = i32(b.slot_start, s);
  v.new_slot_start = i32(b.new_slot_start, s + 1);
  v.new_slots = i32(b.new_slots, static_cast<size_t>(limits_.max_slots));
  v.sample = std::span<uint8_t>(base + b.sample, s);
  v.sampling = std::span<SamplingParams>(reinterpret_cast<SamplingParams*>(base + b.sampling), s);
  v.n_generated = i32(b.n_generated, s);
  v.history_start = i32(b.history_start, s + 1);
  v.history_ids = i32(b.history_ids, static_cast<size_t>(limits_.max_history));
  v.n_prompt = i32(b.n_prompt, s);
  v.sampled_ids = i32(b.sampled_ids, s);
  v.top_ids = i32(b.top_ids, s * kMaxStepTopLogits);
  v.top_values =
      std::span<float>(reinterpret_cast<float*>(base + b.top_values), s * kMaxStepTopLogits);
  v.logprobs = std::span<float>(reinterpret_cast<float*>(base + b.logprobs), s);
  v.lse = std::span<float>(reinterpret_cast<float*>(base + b.lse), s);
  v.image_start = i32(b.image_start, s + 1);
  v.image_slot = i32(b.image_slot, static_cast<size_t>(limits_.max_images));
  v.image_pos = i32(b.image_pos, static_cast<size_t>(limits_.max_images));
  return v;
}

}  // namespace litellama::proto
