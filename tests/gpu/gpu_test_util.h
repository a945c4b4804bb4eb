// Helpers of the GPU tests: the "no CUDA device" skip, status/CUDA assertions, device buffers,
// random tensors stored in a compute dtype, NaN poisoning and tolerance checks per dtype.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/gpu_runtime.h"

namespace litellama::gpu_test {

inline bool cuda_device_present() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

#define LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE()                                             \
  do {                                                                                   \
    if (!::litellama::gpu_test::cuda_device_present()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Skips a test of a path that portable builds do not compile (LITELLAMA_PORTABLE_KERNELS, every
// HIP build and CUDA builds that force it: kernels/gpu_runtime.h), naming the path. The portable
// code that replaces it is tested by the tests that do run there.
#define LITELLAMA_SKIP_IN_PORTABLE_BUILD(what)                                                  \
  do {                                                                                          \
    if (LITELLAMA_PORTABLE_KERNELS) GTEST_SKIP() << "portable build: " what " is not compiled"; \
  } while (0)

#define LITELLAMA_ASSERT_CUDA(expr)                                            \
  do {                                                                         \
    const cudaError_t _err = (expr);                                           \
    ASSERT_EQ(_err, cudaSuccess) << #expr << ": " << cudaGetErrorString(_err); \
  } while (0)

#define LITELLAMA_ASSERT_OK(expr)                                 \
  do {                                                            \
    const ::litellama::Status _st = (expr);                       \
    ASSERT_TRUE(_st.is_ok()) << #expr << ": " << _st.to_string(); \
  } while (0)

inline const char* dtype_label(DType dtype) {
  return dtype_torch_name(dtype);
}

// `f32`, `bf16` or `f16` by the compute dtype; 0 for the integer and 8-bit storage types, which
// are never a kernel's compute dtype.
inline double per_float_dtype(DType dtype, double f32, double bf16, double f16) {
  if (dtype == DType::kF32) return f32;
  if (dtype == DType::kBF16) return bf16;
  if (dtype == DType::kF16) return f16;
  return 0.0;
}

// Largest |out - ref| allowed, relative to max(1, |ref|): float32 rounding, or one or two units
// in the last place of the 16-bit types after a float32 computation.
inline double tolerance(DType dtype) {
  return per_float_dtype(dtype, 2e-5, 1.6e-2, 2e-3);
}

// One device allocation, filled with NaN bytes (0xff) so unwritten elements show.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : bytes_(std::max<size_t>(bytes, 16)) {
    if (cudaMalloc(&ptr_, bytes_) != cudaSuccess) {
      ptr_ = nullptr;
      return;
    }
    poison();
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      if (ptr_ != nullptr) (void)cudaFree(ptr_);
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  ~DevBuf() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  // cudaMemset on device memory runs on the legacy stream and may return before it lands; the
  // tests' streams are non-blocking and would not wait for it, so a late poison could overwrite
  // what a kernel or copy on them has just written. Waiting here orders it before all of them.
  void poison() {
    (void)cudaMemset(ptr_, 0xff, bytes_);
    (void)cudaDeviceSynchronize();
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DevBuf upload(const std::vector<T>& host) {
  DevBuf b(host.size() * sizeof(T));
  if (!host.empty()) {
    (void)cudaMemcpy(b.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    // From pageable memory cudaMemcpy may return before the DMA has landed, and the tests' own
    // streams are non-blocking (they do not wait for the legacy stream): wait for the copy here,
    // so that a kernel or copy on any stream reads the uploaded bytes.
    (void)cudaDeviceSynchronize();
  }
  return b;
}

template <typename T>
std::vector<T> download(const DevBuf& b, size_t n) {
  std::vector<T> host(n);
  if (n > 0) (void)cudaMemcpy(host.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

// n elements of `dtype` on the device, read back as float.
inline std::vector<float> download_as_f32(const DevBuf& b, size_t n, DType dtype) {
  std::vector<uint8_t> bytes(n * dtype_size_bytes(dtype));
  if (n > 0) (void)cudaMemcpy(bytes.data(), b.get(), bytes.size(), cudaMemcpyDeviceToHost);
  std::vector<float> out(n);
  convert_to_f32(out.data(), bytes.data(), dtype, n);
  return out;
}

// Random values stored in `dtype`: `bytes` for the device, `values` what the kernel reads.
struct Tensor {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

inline Tensor random_tensor(size_t n, DType dtype, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> raw(n);
  for (float& x : raw) x = dist(rng);
  Tensor t;
  t.bytes.resize(n * dtype_size_bytes(dtype));
  convert_from_f32(t.bytes.data(), dtype, raw.data(), n);
  t.values.resize(n);
  convert_to_f32(t.values.data(), t.bytes.data(), dtype, n);
  return t;
}

inline std::vector<float> random_floats(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every element finite and within tolerance(dtype) * max(1, |ref|) of the reference; reports the
// first few failures and the worst error.
inline ::testing::AssertionResult all_close(const std::vector<float>& out,
                                            const std::vector<float>& ref, DType dtype,
                                            double scale = 1.0) {
  if (out.size() != ref.size()) {
    return ::testing::AssertionFailure() << "size " << out.size() << " != " << ref.size();
  }
  const double tol = tolerance(dtype) * scale;
  size_t n_bad = 0;
  double worst = 0;
  std::string first;
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = std::fabs(static_cast<double>(out[i]) - ref[i]) /
                       std::max(1.0, std::fabs(static_cast<double>(ref[i])));
    const bool bad = !std::isfinite(out[i]) || !(err <= tol);
    if (std::isfinite(out[i])) worst = std::max(worst, err);
    if (bad && n_bad++ < 5) {
      first += " [" + std::to_string(i) + "] " + std::to_string(out[i]) + " vs " +
               std::to_string(ref[i]);
    }
  }
  if (n_bad > 0) {
    return ::testing::AssertionFailure() << n_bad << " of " << out.size() << " elements off (tol "
                                         << tol << ", worst " << worst << "):" << first;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace litellama::gpu_test
