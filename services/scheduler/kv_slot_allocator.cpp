#include "services/scheduler/kv_slot_allocator.h"

#include <algorithm>

namespace litellama {

KvSlotAllocator::KvSlotAllocator(int32_t n_slots) {
  reset(n_slots);
}

void KvSlotAllocator::reset(int32_t n_slots) {
  const auto n = static_cast<size_t>(std::max(n_slots, 0));
  refcount_.assign(n, 0);
  cached_.assign(n, 0);
  n_cached_idle_ = 0;
  free_.resize(n);
  for (size_t i = 0; i < n; ++i) free_[i] = static_cast<int32_t>(n - 1 - i);
  n_reserved_ = 0;
}

Status KvSlotAllocator::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n < 0 || n > n_free()) {
    return make_error(StatusCode::kResourceExhausted, "need {} KV slots, {} free", n, n_free());
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t slot = free_.back();
    free_.pop_back();
    refcount_[static_cast<size_t>(slot)] = 1;
    out->push_back(slot);
  }
  return Status::ok();
}

void KvSlotAllocator::retain(std::span<const int32_t> slots) {
  for (int32_t slot : slots) {
    const auto i = static_cast<size_t>(slot);
    if (++refcount_[i] == 2 && cached_[i]) --n_cached_idle_;
  }
}

void KvSlotAllocator::release(std::span<const int32_t> slots) {
  for (int32_t slot : slots) {
    const auto i = static_cast<size_t>(slot);
    int32_t& rc = refcount_[i];
    if (rc <= 0) continue;  // never double-free into the list
    --rc;
    if (rc == 1 && cached_[i]) ++n_cached_idle_;
    if (rc == 0) {
      // The cache unmarks before it lets go; a marked slot reaching 0 was released by someone
      // else on its behalf (clear): it stops counting as cached.
      if (cached_[i]) {
        cached_[i] = 0;
        --n_cached_idle_;
      }
      free_.push_back(slot);
    }
  }
}

void KvSlotAllocator::set_cached(std::span<const int32_t> slots, bool cached) {
  for (int32_t slot : slots) {
    const auto i = static_cast<size_t>(slot);
    if (i >= cached_.size() || (cached_[i] != 0) == cached) continue;  // (a pool already reset)
    cached_[i] = cached ? 1 : 0;
    if (refcount_[i] == 1) n_cached_idle_ += cached ? 1 : -1;
  }
}

Status KvSlotAllocator::reserve(int64_t n) {
  if (n < 0 || n > n_free_unreserved()) {
    return make_error(StatusCode::kResourceExhausted, "cannot reserve {} KV slots ({} available)",
                      n, n_free_unreserved());
  }
  n_reserved_ += n;
  return Status::ok();
}

void KvSlotAllocator::unreserve(int64_t n) {
  n_reserved_ = std::max<int64_t>(0, n_reserved_ - n);
}

}  // namespace litellama
