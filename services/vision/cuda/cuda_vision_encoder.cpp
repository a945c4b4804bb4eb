#include "services/vision/cuda/cuda_vision_encoder.h"

#include <cstring>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/gpu_runtime.h"
#include "kernels/linear.h"
#include "kernels/vision_ops.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cuda/cuda_context.h"
#include "services/worker/cuda/device_buffer.h"

namespace litellama::vision {

namespace {

struct Layer {
  DeviceBuffer ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

}  // namespace

struct CudaVisionEncoder::Impl {
  CudaContext ctx;
  DeviceBuffer class_embedding, position_embedding, patch_w, pre_ln_w, pre_ln_b;
  std::vector<Layer> layers;
  DeviceBuffer proj1_w, proj1_b, proj2_w, proj2_b;
  // Activations: x the residual stream [T, H]; h the normed rows [T, H]; qkv [T, 3H]; attn [T, H];
  // mid [T, max(inter, text_hidden)]; patches [n_patches, 3 p^2]; attention workspace.
  DeviceBuffer x, h, qkv, attn, mid, patches, attention_ws;
  PinnedBuffer patches_host;
  DeviceBuffer features;  // float32 [n_image_tokens, H] for vision_features()
};

Result<std::unique_ptr<DevicePoolRows>> DevicePoolRows::allocate(uint64_t bytes) {
  std::unique_ptr<DevicePoolRows> rows(new DevicePoolRows());
  void* data = nullptr;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, bytes));
  rows->data_ = static_cast<float*>(data);
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemset(data, 0, bytes));
  cudaIpcMemHandle_t handle;
  static_assert(sizeof handle == std::tuple_size_v<decltype(rows->exported_.ipc_handle)>);
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, data));
  std::memcpy(rows->exported_.ipc_handle.data(), &handle, sizeof handle);
  int device = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  unsigned char uuid[16];
  LITELLAMA_CUDA_RETURN_IF_ERROR(gpu_device_uuid(device, uuid));
  std::memcpy(rows->exported_.device_uuid.data(), uuid, sizeof uuid);
  return rows;
}

DevicePoolRows::~DevicePoolRows() {
  if (data_ != nullptr) (void)cudaFree(data_);
}

CudaVisionEncoder::~CudaVisionEncoder() = default;

Result<std::unique_ptr<CudaVisionEncoder>> CudaVisionEncoder::load(const Checkpoint& ckpt,
                                                                   DType dtype) {
  if (ckpt.llava() == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "'{}' is not a LLaVA checkpoint (no vision tower)", ckpt.dir());
  }
  if (!vision_ops_supports(dtype) || !linear_supports(dtype, dtype) ||
      !linear_supports(dtype, DType::kF32)) {
    return make_error(StatusCode::kUnsupported, "the vision tower does not run in {}",
                      dtype_torch_name(dtype));
  }
  std::unique_ptr<CudaVisionEncoder> enc(new CudaVisionEncoder());
  enc->config_ = *ckpt.llava();
  enc->dtype_ = dtype;
  enc->impl_ = std::make_unique<Impl>();
  Impl& m = *enc->impl_;
  LITELLAMA_RETURN_IF_ERROR(m.ctx.init());
  const LlavaTensorNames& n = ckpt.llava_names();
  size_t weight_bytes = 0;
  // Uploads the concatenation of `names` (each read as float32, then stored as `as`).
  auto upload = [&](std::initializer_list<std::string> names, DType as,
                    DeviceBuffer* dst) -> Status {
    std::vector<float> all;
    for (const std::string& name : names) {
      LITELLAMA_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(name));
      std::vector<float> v = t.to_f32();
      all.insert(all.end(), v.begin(), v.end());
    }
    const size_t bytes = all.size() * dtype_size_bytes(as);
    std::vector<char> stored(bytes);
    convert_from_f32(stored.data(), as, all.data(), all.size());
    LITELLAMA_ASSIGN_OR_RETURN(*dst, DeviceBuffer::allocate(bytes));
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst->data(), stored.data(), bytes, cudaMemcpyHostToDevice));
    weight_bytes += bytes;
    return Status::ok();
  };
  const DType f32 = DType::kF32;
  LITELLAMA_RETURN_IF_ERROR(
      upload({n.vision("embeddings.class_embedding")}, f32, &m.class_embedding));
  LITELLAMA_RETURN_IF_ERROR(
      upload({n.vision("embeddings.position_embedding.weight")}, f32, &m.position_embedding));
  LITELLAMA_RETURN_IF_ERROR(
      upload({n.vision("embeddings.patch_embedding.weight")}, dtype, &m.patch_w));
  LITELLAMA_RETURN_IF_ERROR(upload({n.vision("pre_layrnorm.weight")}, f32, &m.pre_ln_w));
  LITELLAMA_RETURN_IF_ERROR(upload({n.vision("pre_layrnorm.bias")}, f32, &m.pre_ln_b));
  const LlavaConfig& cfg = enc->config_;
  m.layers.resize(static_cast<size_t>(cfg.n_layers_used()));
  for (int32_t l = 0; l < cfg.n_layers_used(); ++l) {
    Layer& L = m.layers[static_cast<size_t>(l)];
    auto name = [&](const char* s) { return n.layer(l, s); };
    LITELLAMA_RETURN_IF_ERROR(upload({name("layer_norm1.weight")}, f32, &L.ln1_w));
    LITELLAMA_RETURN_IF_ERROR(upload({name("layer_norm1.bias")}, f32, &L.ln1_b));
    LITELLAMA_RETURN_IF_ERROR(
        upload({name("self_attn.q_proj.weight"), name("self_attn.k_proj.weight"),
                name("self_attn.v_proj.weight")},
               dtype, &L.qkv_w));
    LITELLAMA_RETURN_IF_ERROR(upload({name("self_attn.q_proj.bias"), name("self_attn.k_proj.bias"),
                                      name("self_attn.v_proj.bias")},
                                     f32, &L.qkv_b));
    LITELLAMA_RETURN_IF_ERROR(upload({name("self_attn.out_proj.weight")}, dtype, &L.o_w));
    LITELLAMA_RETURN_IF_ERROR(upload({name("self_attn.out_proj.bias")}, f32, &L.o_b));
    LITELLAMA_RETURN_IF_ERROR(upload({name("layer_norm2.weight")}, f32, &L.ln2_w));
    LITELLAMA_RETURN_IF_ERROR(upload({name("layer_norm2.bias")}, f32, &L.ln2_b));
    LITELLAMA_RETURN_IF_ERROR(upload({name("mlp.fc1.weight")}, dtype, &L.fc1_w));
    LITELLAMA_RETURN_IF_ERROR(upload({name("mlp.fc1.bias")}, f32, &L.fc1_b));
    LITELLAMA_RETURN_IF_ERROR(upload({name("mlp.fc2.weight")}, dtype, &L.fc2_w));
    LITELLAMA_RETURN_IF_ERROR(upload({name("mlp.fc2.bias")}, f32, &L.fc2_b));
  }
  LITELLAMA_RETURN_IF_ERROR(upload({n.projector("linear_1.weight")}, dtype, &m.proj1_w));
  LITELLAMA_RETURN_IF_ERROR(upload({n.projector("linear_2.weight")}, dtype, &m.proj2_w));
  if (cfg.projector_bias) {
    LITELLAMA_RETURN_IF_ERROR(upload({n.projector("linear_1.bias")}, f32, &m.proj1_b));
    LITELLAMA_RETURN_IF_ERROR(upload({n.projector("linear_2.bias")}, f32, &m.proj2_b));
  }
  enc->weight_bytes_ = weight_bytes;

  const ClipVisionConfig& vc = cfg.vision;
  const size_t T = static_cast<size_t>(vc.n_positions()), H = static_cast<size_t>(vc.hidden_size);
  const size_t e = dtype_size_bytes(dtype);
  const size_t patch_len = 3 * static_cast<size_t>(vc.patch_size) * vc.patch_size;
  const size_t mid_cols = std::max<size_t>(static_cast<size_t>(vc.intermediate_size),
                                           static_cast<size_t>(cfg.text_hidden_size));
  size_t ws = 0;
  auto alloc = [&](size_t bytes, DeviceBuffer* dst) -> Status {
    LITELLAMA_ASSIGN_OR_RETURN(*dst, DeviceBuffer::allocate(bytes));
    ws += bytes;
    return Status::ok();
  };
  LITELLAMA_RETURN_IF_ERROR(alloc(T * H * e, &m.x));
  LITELLAMA_RETURN_IF_ERROR(alloc(T * H * e, &m.h));
  LITELLAMA_RETURN_IF_ERROR(alloc(T * 3 * H * e, &m.qkv));
  LITELLAMA_RETURN_IF_ERROR(alloc(T * H * e, &m.attn));
  LITELLAMA_RETURN_IF_ERROR(alloc(T * mid_cols * e, &m.mid));
  LITELLAMA_RETURN_IF_ERROR(alloc(static_cast<size_t>(vc.n_patches()) * patch_len * e, &m.patches));
  LITELLAMA_RETURN_IF_ERROR(
      alloc(dense_attention_workspace_bytes(static_cast<int32_t>(T), vc.n_heads, dtype),
            &m.attention_ws));
  LITELLAMA_ASSIGN_OR_RETURN(
      m.patches_host, PinnedBuffer::allocate(static_cast<size_t>(vc.n_patches()) * patch_len * e));
  enc->workspace_bytes_ = ws;
  return enc;
}

Status CudaVisionEncoder::run_tower(const PixelValues& pixels) {
  const ClipVisionConfig& vc = config_.vision;
  LITELLAMA_RETURN_IF_ERROR(check_pixel_values(pixels, vc));
  Impl& m = *impl_;
  const cudaStream_t stream = m.ctx.stream();
  const LinearHandle blas = m.ctx.linear();
  const int32_t T = vc.n_positions(), H = vc.hidden_size, inter = vc.intermediate_size;
  const int32_t n_patches = vc.n_patches(), patch_len = 3 * vc.patch_size * vc.patch_size;
  const float eps = static_cast<float>(vc.layer_norm_eps);
  const size_t e = dtype_size_bytes(dtype_);

  const std::vector<float> patches = flatten_patches(pixels, vc.patch_size);
  convert_from_f32(m.patches_host.data(), dtype_, patches.data(), patches.size());
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.ctx.step_start(), stream));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      m.patches.data(), m.patches_host.data(), patches.size() * e, cudaMemcpyHostToDevice, stream));
  // Patch convolution into rows 1.. of x; then the class row and the position embeddings.
  LITELLAMA_RETURN_IF_ERROR(launch_linear(m.x.as<char>(H * e), m.patches.data(), m.patch_w.data(),
                                          n_patches, H, patch_len, dtype_, dtype_, blas, stream));
  LITELLAMA_RETURN_IF_ERROR(launch_add_class_position(m.x.data(), m.class_embedding.as<float>(),
                                                      m.position_embedding.as<float>(), T, H,
                                                      dtype_, stream));
  LITELLAMA_RETURN_IF_ERROR(launch_layer_norm(m.x.data(), m.x.data(), m.pre_ln_w.as<float>(),
                                              m.pre_ln_b.as<float>(), T, H, eps, dtype_, stream));
  for (const Layer& L : m.layers) {
    LITELLAMA_RETURN_IF_ERROR(launch_layer_norm(m.h.data(), m.x.data(), L.ln1_w.as<float>(),
                                                L.ln1_b.as<float>(), T, H, eps, dtype_, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.qkv.data(), m.h.data(), L.qkv_w.data(), T, 3 * H, H,
                                            dtype_, dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.qkv.data(), m.qkv.data(), L.qkv_b.as<float>(),
                                              nullptr, T, 3 * H, VisionActivation::kNone, dtype_,
                                              stream));
    LITELLAMA_RETURN_IF_ERROR(launch_dense_attention(m.attn.data(), m.qkv.data(),
                                                     m.attention_ws.data(), T, vc.n_heads,
                                                     H / vc.n_heads, dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.h.data(), m.attn.data(), L.o_w.data(), T, H, H,
                                            dtype_, dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.x.data(), m.h.data(), L.o_b.as<float>(), m.x.data(),
                                              T, H, VisionActivation::kNone, dtype_, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_layer_norm(m.h.data(), m.x.data(), L.ln2_w.as<float>(),
                                                L.ln2_b.as<float>(), T, H, eps, dtype_, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.mid.data(), m.h.data(), L.fc1_w.data(), T, inter, H,
                                            dtype_, dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.mid.data(), m.mid.data(), L.fc1_b.as<float>(),
                                              nullptr, T, inter, VisionActivation::kQuickGelu,
                                              dtype_, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.h.data(), m.mid.data(), L.fc2_w.data(), T, H, inter,
                                            dtype_, dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.x.data(), m.h.data(), L.fc2_b.as<float>(),
                                              m.x.data(), T, H, VisionActivation::kNone, dtype_,
                                              stream));
  }
  return Status::ok();
}

Status CudaVisionEncoder::run_projector(float* dst) {
  Impl& m = *impl_;
  const cudaStream_t stream = m.ctx.stream();
  const LinearHandle blas = m.ctx.linear();
  const int32_t H = config_.vision.hidden_size, th = config_.text_hidden_size;
  const int32_t n_rows = config_.n_image_tokens();
  const size_t e = dtype_size_bytes(dtype_);
  // The "default" strategy drops the class token's row: the features start at row 1.
  const void* features =
      config_.feature_select == VisionFeatureSelect::kDefault ? m.x.as<char>(H * e) : m.x.data();
  LITELLAMA_RETURN_IF_ERROR(launch_linear(m.mid.data(), features, m.proj1_w.data(), n_rows, th, H,
                                          dtype_, dtype_, blas, stream));
  LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.mid.data(), m.mid.data(), m.proj1_b.as<float>(),
                                            nullptr, n_rows, th, VisionActivation::kGeluErf, dtype_,
                                            stream));
  // linear_2 writes float32 rows into the destination; its bias is added there.
  LITELLAMA_RETURN_IF_ERROR(launch_linear(dst, m.mid.data(), m.proj2_w.data(), n_rows, th, th,
                                          dtype_, DType::kF32, blas, stream));
  LITELLAMA_RETURN_IF_ERROR(launch_bias_act(dst, dst, m.proj2_b.as<float>(), nullptr, n_rows, th,
                                            VisionActivation::kNone, DType::kF32, stream));
  return Status::ok();
}

Status CudaVisionEncoder::encode_to_device(const PixelValues& pixels, float* dst) {
  LITELLAMA_RETURN_IF_ERROR(run_tower(pixels));
  LITELLAMA_RETURN_IF_ERROR(run_projector(dst));
  Impl& m = *impl_;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.ctx.step_end(), m.ctx.stream()));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.ctx.stream()));
  float ms = 0.0f;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, m.ctx.step_start(), m.ctx.step_end()));
  last_device_seconds_ = ms / 1000.0;
  return Status::ok();
}

Result<std::vector<float>> CudaVisionEncoder::encode(const PixelValues& pixels) {
  const size_t n = static_cast<size_t>(config_.n_image_tokens()) * config_.text_hidden_size;
  LITELLAMA_ASSIGN_OR_RETURN(DeviceBuffer rows, DeviceBuffer::allocate(n * sizeof(float)));
  LITELLAMA_RETURN_IF_ERROR(encode_to_device(pixels, rows.as<float>()));
  std::vector<float> out(n);
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out.data(), rows.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

Result<std::vector<float>> CudaVisionEncoder::vision_features(const PixelValues& pixels) {
  LITELLAMA_RETURN_IF_ERROR(run_tower(pixels));
  Impl& m = *impl_;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.ctx.stream()));
  const size_t H = static_cast<size_t>(config_.vision.hidden_size);
  const size_t rows = static_cast<size_t>(config_.n_image_tokens());
  const size_t first = config_.feature_select == VisionFeatureSelect::kDefault ? 1 : 0;
  std::vector<char> stored(rows * H * dtype_size_bytes(dtype_));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpy(stored.data(),
                                            m.x.as<char>(first * H * dtype_size_bytes(dtype_)),
                                            stored.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(rows * H);
  convert_to_f32(out.data(), stored.data(), dtype_, out.size());
  return out;
}

}  // namespace litellama::vision
