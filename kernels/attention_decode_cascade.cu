// Shared-prefix (cascade) decode attention: attention_decode.h's DecodeCascade. The tasks run the
// tensor-core decode kernel (attention_decode_tc.cuh) in its kTasks form: each CTA takes one task's
// key range of one table for the query heads of all its member sequences (member j's heads are
// rows j * group .. j * group + group - 1) and writes every row's normalized partial output and
// base-2 log-sum-exp to the member's part row; the merge kernel then combines each sequence's
// parts with weights 2^(lse_i - max lse), as the split-K merge does. A task of up to 16 rows (a
// sequence's own keys, small groups) runs as the split-K kernel does, its warps splitting each
// tile's keys over one 16-row mma tile; a larger one (up to 64 rows) gives each warp 16 rows
// against the whole tile, so a shared prefix is read once for up to 64 / group sequences.
#include "kernels/attention_decode.h"

#include <algorithm>
#include <type_traits>

#include "kernels/attention_decode_tc.cuh"
#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
#if !LITELLAMA_PORTABLE_KERNELS

namespace {

// A cascade's parts of each (work item, head): part_start[work] .. part_start[work + 1] - 1.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attention_decode_cascade_merge_kernel(const DecodeParams<T> p, int n_work) {
  pdl_launch_dependents();
  pdl_wait();
  int work, head, d;
  if (!merge_thread<D>(n_work, p.n_heads, &work, &head, &d)) return;
  const int seq = p.seq_ids[work];
  const int begin = p.part_start[work];
  merge_parts<T, D>(p, static_cast<int64_t>(begin) * p.n_heads + head,
                    p.part_start[work + 1] - begin,
                    p.out + (static_cast<int64_t>(p.token_start[seq]) * p.n_heads + head) * D, d);
}

template <typename T, int D>
Status launch_cascade_typed(const AttentionArgs& a, const DecodeCascade& cc, void* workspace) {
  auto* part_o = static_cast<float*>(workspace);
  float* part_lse = part_o + static_cast<size_t>(cc.max_parts) * a.n_heads * D;
  DecodeParams<T> p{typed_tensors<T>(a.tensors), part_o, part_lse, a.n_heads, a.n_kv_heads,
                    a.n_heads / a.n_kv_heads,    1,      a.scale};
  p.n_tasks = cc.n_tasks;
  p.tasks = cc.tasks;
  p.members = cc.members;
  p.part_start = cc.part_start;
  using L = TcLayout<T, D>;
  auto* kernel = attention_decode_tc_kernel<T, D, false, false, true>;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::kSmemBytes)));
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  const dim3 grid(static_cast<unsigned>(cc.max_tasks), 1, static_cast<unsigned>(a.n_kv_heads));
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      launch_kernel_shaped(kernel, grid, dim3(kThreads), L::kSmemBytes, a.stream,
                           LaunchShape{0u, cudaSharedmemCarveoutMaxShared}, p));
  constexpr int kHeadsPerBlock = kThreads / (D / 4);
  const int64_t n_rows = static_cast<int64_t>(a.n_work) * a.n_heads;
  const unsigned merge_blocks = static_cast<unsigned>(ceil_div<int64_t>(n_rows, kHeadsPerBlock));
  LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(attention_decode_cascade_merge_kernel<T, D>,
                                               dim3(merge_blocks), dim3(kThreads), 0, a.stream, p,
                                               a.n_work));
  return Status::ok();
}

}  // namespace

int32_t attention_decode_cascade_members(DType dtype, int32_t head_dim, int32_t n_heads,
                                         int32_t n_kv_heads) {
  if ((dtype != DType::kBF16 && dtype != DType::kF16) || !attention_decode_tuned(head_dim) ||
      !attention_shapes_supported(dtype, n_heads, n_kv_heads)) {
    return 0;
  }
  const int32_t members = kCascadeRows / (n_heads / n_kv_heads);
  return members >= 2 ? members : 0;
}

size_t attention_decode_cascade_workspace_bytes(int32_t max_parts, int32_t n_heads,
                                                int32_t head_dim) {
  // part_o [max_parts * n_heads][head_dim] then part_lse [max_parts * n_heads], in float.
  return static_cast<size_t>(std::max(max_parts, 0)) * n_heads * (head_dim + 1) * sizeof(float);
}

Status launch_attention_decode_cascade(const AttentionTensors<void>& tensors,
                                       const DecodeCascade& cascade, int32_t n_work,
                                       int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                       DType dtype, float scale, void* workspace,
                                       size_t workspace_bytes, KernelStream stream) {
  if (attention_decode_cascade_members(dtype, head_dim, n_heads, n_kv_heads) == 0) {
    return make_error(StatusCode::kUnsupported,
                      "attention_decode_cascade: {} with head_dim {} and heads {}/{} has no "
                      "cascade kernel",
                      dtype_torch_name(dtype), head_dim, n_heads, n_kv_heads);
  }
  if (n_work == 0 || cascade.max_tasks == 0) return Status::ok();
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0 ||
      workspace_bytes <
          attention_decode_cascade_workspace_bytes(cascade.max_parts, n_heads, head_dim)) {
    return make_error(StatusCode::kInvalidArgument,
                      "attention_decode_cascade: workspace of {} bytes holds fewer than {} parts",
                      workspace_bytes, cascade.max_parts);
  }
  const AttentionArgs a{tensors, n_work, n_heads, n_kv_heads, scale, stream};
  return dispatch_float_dtype(dtype, "attention_decode_cascade", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    if constexpr (std::is_same_v<T, float>) {
      return make_error(StatusCode::kUnsupported, "attention_decode_cascade: float32");
    } else {
      return dispatch_tuned_head_dim(head_dim, "attention_decode_cascade", [&](auto d) {
        return launch_cascade_typed<T, decltype(d)::value>(a, cascade, workspace);
      });
    }
  });
}

#else  // LITELLAMA_PORTABLE_KERNELS

int32_t attention_decode_cascade_members(DType /*dtype*/, int32_t /*head_dim*/, int32_t /*n_heads*/,
                                         int32_t /*n_kv_heads*/) {
  return 0;
}

size_t attention_decode_cascade_workspace_bytes(int32_t /*max_parts*/, int32_t /*n_heads*/,
                                                int32_t /*head_dim*/) {
  return 0;
}

Status launch_attention_decode_cascade(const AttentionTensors<void>& /*tensors*/,
                                       const DecodeCascade& /*cascade*/, int32_t /*n_work*/,
                                       int32_t /*n_heads*/, int32_t /*n_kv_heads*/,
                                       int32_t /*head_dim*/, DType /*dtype*/, float /*scale*/,
                                       void* /*workspace*/, size_t /*workspace_bytes*/,
                                       KernelStream /*stream*/) {
  return make_error(StatusCode::kUnsupported,
                    "attention_decode_cascade: portable build (tuned decode kernels not compiled)");
}

#endif

}  // namespace litellama
