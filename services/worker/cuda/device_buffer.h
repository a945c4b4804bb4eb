// Owning handles of device memory (cudaMalloc) and pinned host memory (cudaMallocHost). Move-only;
// the destructor frees (a failure to free at teardown is not reportable and is ignored).
#pragma once

#include <cstddef>
#include <utility>

#include "common/status.h"
#include "kernels/cuda_check.h"
#include "kernels/gpu_runtime.h"

namespace litellama {

template <bool kPinnedHost>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  CudaBuffer(CudaBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_bytes_(std::exchange(o.size_bytes_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_bytes_ = std::exchange(o.size_bytes_, 0);
    }
    return *this;
  }
  ~CudaBuffer() { reset(); }

  static Result<CudaBuffer> allocate(size_t size_bytes) {
    CudaBuffer b;
    if (size_bytes == 0) return b;
    if constexpr (kPinnedHost) {
      LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&b.ptr_, size_bytes));
    } else {
      LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.ptr_, size_bytes));
    }
    b.size_bytes_ = size_bytes;
    return b;
  }

  void* data() const { return ptr_; }
  template <typename T>
  T* as(size_t offset_bytes = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + offset_bytes);
  }
  size_t size_bytes() const { return size_bytes_; }

 private:
  void reset() {
    if (ptr_ == nullptr) return;
    if constexpr (kPinnedHost) {
      (void)cudaFreeHost(ptr_);
    } else {
      (void)cudaFree(ptr_);
    }
    ptr_ = nullptr;
    size_bytes_ = 0;
  }

  void* ptr_ = nullptr;
  size_t size_bytes_ = 0;
};

using DeviceBuffer = CudaBuffer<false>;
using PinnedBuffer = CudaBuffer<true>;

// Rounds n up to a multiple of `alignment` (a power of two).
constexpr size_t align_up(size_t n, size_t alignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}

}  // namespace litellama
