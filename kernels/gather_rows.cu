// Row gather: one block per output row, 16-byte copies when the row allows them.
#include "kernels/gather_rows.h"

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

template <typename T, int N>
__global__ void gather_rows_kernel(T* __restrict__ out, const T* __restrict__ in,
                                   const int32_t* __restrict__ rows, int cols) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t src_row = rows[blockIdx.x];
  const T* src = in + src_row * cols;
  T* dst = out + static_cast<int64_t>(blockIdx.x) * cols;
  for (int i = threadIdx.x * N; i < cols; i += blockDim.x * N) {
    store_vec<T, N>(dst + i, load_vec<T, N>(src + i));
  }
}

template <typename T>
Status launch_typed(void* out, const void* in, const int32_t* rows, int32_t n_rows_out,
                    int32_t cols, KernelStream stream) {
  const int n = vec_width(cols, sizeof(T));
  const int threads = std::min(256, std::max(32, (cols / n + 31) / 32 * 32));
  if (n == 1) {
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(gather_rows_kernel<T, 1>, dim3(n_rows_out),
                                                 dim3(threads), 0, stream, static_cast<T*>(out),
                                                 static_cast<const T*>(in), rows, cols));
  } else {
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        launch_kernel(gather_rows_kernel<T, 16 / sizeof(T)>, dim3(n_rows_out), dim3(threads), 0,
                      stream, static_cast<T*>(out), static_cast<const T*>(in), rows, cols));
  }
  return Status::ok();
}

// One block per input row.
template <typename T>
__global__ void scatter_rows_f32_kernel(T* __restrict__ out, const float* __restrict__ in,
                                        const int32_t* __restrict__ rows,
                                        const int32_t* __restrict__ src_rows, int cols) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t src_row = src_rows != nullptr ? src_rows[blockIdx.x] : blockIdx.x;
  const float* src = in + src_row * cols;
  T* dst = out + static_cast<int64_t>(rows[blockIdx.x]) * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = from_float<T>(src[i]);
}

// One block per sequence.
__global__ void write_slot_table_kernel(int32_t* __restrict__ table,
                                        const int32_t* __restrict__ slot_start,
                                        const int32_t* __restrict__ kv_len,
                                        const int32_t* __restrict__ new_slot_start,
                                        const int32_t* __restrict__ new_slots) {
  pdl_launch_dependents();
  pdl_wait();
  const int s = blockIdx.x;
  const int32_t begin = new_slot_start[s];
  const int32_t n_w = new_slot_start[s + 1] - begin;
  int32_t* dst = table + slot_start[s] + kv_len[s] - n_w;
  for (int32_t i = threadIdx.x; i < n_w; i += blockDim.x) dst[i] = new_slots[begin + i];
}

}  // namespace

bool gather_rows_supports(DType dtype) {
  return is_float_compute_dtype(dtype);
}

Status launch_gather_rows(void* out, const void* in, const int32_t* rows, int32_t n_rows_out,
                          int32_t cols, DType dtype, KernelStream stream) {
  if (n_rows_out == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "gather_rows", [&](auto type) {
    return launch_typed<typename decltype(type)::type>(out, in, rows, n_rows_out, cols, stream);
  });
}

Status launch_scatter_rows_f32(void* out, const float* in, const int32_t* rows,
                               const int32_t* src_rows, int32_t n_rows, int32_t cols, DType dtype,
                               KernelStream stream) {
  if (n_rows == 0) return Status::ok();
  return dispatch_float_dtype(dtype, "scatter_rows_f32", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    const int threads = std::min(256, std::max(32, (cols + 31) / 32 * 32));
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(scatter_rows_f32_kernel<T>, dim3(n_rows),
                                                 dim3(threads), 0, stream, static_cast<T*>(out), in,
                                                 rows, src_rows, cols));
    return Status::ok();
  });
}

Status launch_write_slot_table(int32_t* table, const int32_t* slot_start, const int32_t* kv_len,
                               const int32_t* new_slot_start, const int32_t* new_slots,
                               int32_t n_seqs, KernelStream stream) {
  if (n_seqs <= 0) return Status::ok();
  LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(write_slot_table_kernel, dim3(n_seqs), dim3(128), 0,
                                               stream, table, slot_start, kv_len, new_slot_start,
                                               new_slots));
  return Status::ok();
}

}  // namespace litellama
