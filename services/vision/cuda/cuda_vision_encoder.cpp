#include "services/vision/cuda/cuda_vision_encoder.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/device_time.h"
#include "kernels/gpu_runtime.h"
#include "kernels/image_preprocess.h"
#include "kernels/linear.h"
#include "kernels/vision_ops.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cuda/cuda_context.h"
#include "services/worker/cuda/device_buffer.h"
#include "services/worker/cuda/graph_runner.h"

namespace litellama::vision {

static_assert(kResamplePrecisionBits == kImageResamplePrecisionBits,
              "the device resampling must use the host's fixed point");

namespace {

struct Layer {
  DeviceBuffer ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

constexpr size_t kStagingAlign = 256;
// The preprocessing plan's tables (coefficients and values) that go up with an image; a plan
// with larger ones (an extreme downscale) is applied on the host.
constexpr size_t kMaxPlanTableBytes = size_t{1} << 20;
// The graphs: the tower with the projector's head (encodes), the tower alone (vision_features).
// Their buffers never move.
constexpr uint64_t kEncodeGraphKey = 1;
constexpr uint64_t kFeaturesGraphKey = 2;

// Grows `buffer` to at least `bytes` (contents dropped).
template <typename Buffer>
Status ensure_bytes(Buffer* buffer, size_t bytes) {
  if (buffer->size_bytes() >= bytes) return Status::ok();
  *buffer = Buffer();
  LITELLAMA_ASSIGN_OR_RETURN(*buffer, Buffer::allocate(bytes));
  return Status::ok();
}

}  // namespace

struct CudaVisionEncoder::Impl {
  CudaContext ctx;
  DeviceBuffer class_embedding, position_embedding, patch_w, pre_ln_w, pre_ln_b;
  std::vector<Layer> layers;
  DeviceBuffer proj1_w, proj1_b, proj2_w, proj2_b;
  // Activations: x the residual stream [T, H]; h the normed rows [T, H]; qkv [T, 3H]; attn [T, H];
  // mid [T, max(inter, text_hidden)]; patches [n_patches, 3 p^2]; attention workspace.
  DeviceBuffer x, h, qkv, attn, mid, patches, attention_ws, cublas_ws;
  PinnedBuffer patches_host;
  // Device preprocessing: the image and the plan's tables go up through pre_host into pre_device;
  // pre_work holds the horizontal pass's rows, then the resized image.
  PinnedBuffer pre_host;
  DeviceBuffer pre_device, pre_work;
  GraphRunner graphs{2};
  bool in_flight = false;
};

Result<std::unique_ptr<DevicePoolRows>> DevicePoolRows::allocate(uint64_t rows_bytes) {
  std::unique_ptr<DevicePoolRows> rows(new DevicePoolRows());
  // The rows, then the timestamp word on its own 256 bytes.
  const uint64_t stamp_offset = (rows_bytes + 255) / 256 * 256;
  const uint64_t bytes = stamp_offset + 256;
  void* data = nullptr;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, bytes));
  rows->data_ = static_cast<float*>(data);
  rows->finished_ns_ = reinterpret_cast<uint64_t*>(static_cast<char*>(data) + stamp_offset);
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemset(data, 0, bytes));
  cudaIpcMemHandle_t handle;
  static_assert(sizeof handle == std::tuple_size_v<decltype(rows->exported_.ipc_handle)>);
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, data));
  std::memcpy(rows->exported_.ipc_handle.data(), &handle, sizeof handle);
  cudaEvent_t event = nullptr;
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess));
  rows->ready_event_ = event;
  cudaIpcEventHandle_t event_handle;
  static_assert(sizeof event_handle == std::tuple_size_v<decltype(rows->exported_.ready_event)>);
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&event_handle, event));
  std::memcpy(rows->exported_.ready_event.data(), &event_handle, sizeof event_handle);
  rows->exported_.finished_ns_offset = stamp_offset;
  int device = 0;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  unsigned char uuid[16];
  LITELLAMA_CUDA_RETURN_IF_ERROR(gpu_device_uuid(device, uuid));
  std::memcpy(rows->exported_.device_uuid.data(), uuid, sizeof uuid);
  return rows;
}

DevicePoolRows::~DevicePoolRows() {
  if (ready_event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(ready_event_));
  if (data_ != nullptr) (void)cudaFree(data_);
}

CudaVisionEncoder::~CudaVisionEncoder() {
  if (impl_ && impl_->in_flight) (void)cudaStreamSynchronize(impl_->ctx.stream());
}

Result<std::unique_ptr<CudaVisionEncoder>> CudaVisionEncoder::load(const Checkpoint& ckpt,
                                                                   DType dtype) {
  if (ckpt.llava() == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "'{}' is not a LLaVA checkpoint (no vision tower)", ckpt.dir());
  }
  if (!vision_ops_supports(dtype) || !image_preprocess_supports(dtype) ||
      !linear_supports(dtype, dtype) || !linear_supports(dtype, DType::kF32)) {
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
  // cuBLAS takes its workspace from here, so that the graph capture allocates nothing.
  LITELLAMA_RETURN_IF_ERROR(alloc(static_cast<size_t>(kVisionCublasWorkspaceBytes), &m.cublas_ws));
  LITELLAMA_RETURN_IF_ERROR(
      linear_handle_set_workspace(m.ctx.linear(), m.cublas_ws.data(), m.cublas_ws.size_bytes()));
  LITELLAMA_ASSIGN_OR_RETURN(
      m.patches_host, PinnedBuffer::allocate(static_cast<size_t>(vc.n_patches()) * patch_len * e));
  enc->workspace_bytes_ = ws;
  return enc;
}

int64_t CudaVisionEncoder::graph_replays() const {
  return impl_->graphs.replays();
}

bool CudaVisionEncoder::tower_graph() const {
  return impl_->graphs.available() && impl_->graphs.captures() > 0;
}

Status CudaVisionEncoder::finish() {
  Impl& m = *impl_;
  if (!m.in_flight) return Status::ok();
  m.in_flight = false;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.ctx.stream()));
  float ms = 0.0f;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, m.ctx.step_start(), m.ctx.step_end()));
  last_device_seconds_ = ms / 1000.0;
  return Status::ok();
}

Status CudaVisionEncoder::enqueue_patches(const PixelValues& pixels) {
  const ClipVisionConfig& vc = config_.vision;
  LITELLAMA_RETURN_IF_ERROR(check_pixel_values(pixels, vc));
  Impl& m = *impl_;
  const std::vector<float> patches = flatten_patches(pixels, vc.patch_size);
  convert_from_f32(m.patches_host.data(), dtype_, patches.data(), patches.size());
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.ctx.step_start(), m.ctx.stream()));
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.patches.data(), m.patches_host.data(),
                                                 patches.size() * dtype_size_bytes(dtype_),
                                                 cudaMemcpyHostToDevice, m.ctx.stream()));
  return Status::ok();
}

Status CudaVisionEncoder::enqueue_preprocess(const RgbImage& image,
                                             const ClipPreprocessConfig& preprocess) {
  const ClipVisionConfig& vc = config_.vision;
  LITELLAMA_ASSIGN_OR_RETURN(ClipPreprocessPlan plan, plan_clip_preprocess(image, preprocess));
  if (plan.out_height != vc.image_size || plan.out_width != vc.image_size) {
    return make_error(StatusCode::kInvalidArgument,
                      "pixel values are {}x{} but the vision tower takes {}x{} images",
                      plan.out_width, plan.out_height, vc.image_size, vc.image_size);
  }
  const RgbImage& source = plan.squared.width > 0 ? plan.squared : image;
  const int64_t source_pixels = int64_t{source.width} * source.height;
  const int64_t rows_pixels = plan.horizontal ? int64_t{plan.n_rows} * plan.resized_width : 0;
  const int64_t resized_pixels = int64_t{plan.resized_width} * plan.resized_height;
  auto table_bytes = [](const ResampleCoefficients& c) {
    return (c.first.size() + c.count.size() + c.weights.size()) * sizeof(int32_t);
  };
  const size_t tables = table_bytes(plan.horiz) + table_bytes(plan.vert) + sizeof plan.value;
  if (std::max({source_pixels, rows_pixels, resized_pixels}) > kVisionDevicePreprocessPixels ||
      tables > kMaxPlanTableBytes) {
    // Too large to stage on the device within the memory the service reserves: on the host.
    return enqueue_patches(apply_clip_preprocess(image, plan));
  }
  Impl& m = *impl_;
  // pre_host / pre_device: [image bytes][horizontal first, count, weights][vertical ...][values].
  auto align = [](size_t n) { return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign; };
  const size_t image_bytes = static_cast<size_t>(source_pixels) * 3;
  size_t offset = align(image_bytes);
  struct Placed {
    size_t first = 0, count = 0, weights = 0;
  };
  auto place = [&](const ResampleCoefficients& c) {
    Placed p;
    p.first = offset;
    offset = align(offset + c.first.size() * sizeof(int32_t));
    p.count = offset;
    offset = align(offset + c.count.size() * sizeof(int32_t));
    p.weights = offset;
    offset = align(offset + c.weights.size() * sizeof(int32_t));
    return p;
  };
  const Placed horiz = place(plan.horiz), vert = place(plan.vert);
  const size_t values = offset;
  const size_t total = align(values + sizeof plan.value);
  LITELLAMA_RETURN_IF_ERROR(ensure_bytes(&m.pre_host, total));
  LITELLAMA_RETURN_IF_ERROR(ensure_bytes(&m.pre_device, total));
  const size_t rows_bytes = static_cast<size_t>(rows_pixels) * 3;
  const size_t resized_bytes = static_cast<size_t>(resized_pixels) * 3;
  LITELLAMA_RETURN_IF_ERROR(ensure_bytes(&m.pre_work, align(rows_bytes) + resized_bytes));
  char* host = m.pre_host.as<char>();
  std::memcpy(host, source.pixels.data(), image_bytes);
  auto copy_table = [&](const ResampleCoefficients& c, const Placed& p) {
    std::copy(c.first.begin(), c.first.end(), reinterpret_cast<int32_t*>(host + p.first));
    std::copy(c.count.begin(), c.count.end(), reinterpret_cast<int32_t*>(host + p.count));
    std::copy(c.weights.begin(), c.weights.end(), reinterpret_cast<int32_t*>(host + p.weights));
  };
  copy_table(plan.horiz, horiz);
  copy_table(plan.vert, vert);
  std::memcpy(host + values, plan.value.data(), sizeof plan.value);

  const cudaStream_t stream = m.ctx.stream();
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.ctx.step_start(), stream));
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(m.pre_device.data(), host, total, cudaMemcpyHostToDevice, stream));
  const char* dev = m.pre_device.as<const char>();
  auto axis = [&](const ResampleCoefficients& c, const Placed& p) {
    ImageResampleAxis a;
    a.first = reinterpret_cast<const int32_t*>(dev + p.first);
    a.count = reinterpret_cast<const int32_t*>(dev + p.count);
    a.weights = reinterpret_cast<const int32_t*>(dev + p.weights);
    a.ksize = c.ksize;
    return a;
  };
  const auto* image_dev = reinterpret_cast<const uint8_t*>(dev);
  uint8_t* rows_dev = m.pre_work.as<uint8_t>();
  uint8_t* resized_dev = m.pre_work.as<uint8_t>(align(rows_bytes));
  const uint8_t* current = image_dev;
  if (plan.horizontal) {
    LITELLAMA_RETURN_IF_ERROR(
        launch_resample_horizontal(rows_dev, current, source.width, plan.first_row, plan.n_rows,
                                   plan.resized_width, axis(plan.horiz, horiz), stream));
    current = rows_dev;
  }
  if (plan.vertical) {
    LITELLAMA_RETURN_IF_ERROR(launch_resample_vertical(
        resized_dev, current, plan.resized_width, plan.horizontal ? plan.first_row : 0,
        plan.resized_height, axis(plan.vert, vert), stream));
    current = resized_dev;
  }
  return launch_crop_normalize_patches(
      m.patches.data(), current, plan.resized_height, plan.resized_width, plan.top, plan.left,
      vc.image_size, vc.patch_size, reinterpret_cast<const float*>(dev + values), dtype_, stream);
}

Status CudaVisionEncoder::run_tower() {
  const ClipVisionConfig& vc = config_.vision;
  Impl& m = *impl_;
  const cudaStream_t stream = m.ctx.stream();
  const LinearHandle blas = m.ctx.linear();
  const int32_t T = vc.n_positions(), H = vc.hidden_size, inter = vc.intermediate_size;
  const int32_t n_patches = vc.n_patches(), patch_len = 3 * vc.patch_size * vc.patch_size;
  const float eps = static_cast<float>(vc.layer_norm_eps);
  const size_t e = dtype_size_bytes(dtype_);
  const int32_t head_dim = H / vc.n_heads;
  // Patch convolution into rows 1.. of x; then the class row and the position embeddings.
  LITELLAMA_RETURN_IF_ERROR(launch_linear(m.x.as<char>(H * e), m.patches.data(), m.patch_w.data(),
                                          n_patches, H, patch_len, dtype_, dtype_, blas, stream));
  LITELLAMA_RETURN_IF_ERROR(launch_add_class_position(m.x.data(), m.class_embedding.as<float>(),
                                                      m.position_embedding.as<float>(), T, H,
                                                      dtype_, stream));
  LITELLAMA_RETURN_IF_ERROR(launch_layer_norm(m.x.data(), m.x.data(), m.pre_ln_w.as<float>(),
                                              m.pre_ln_b.as<float>(), T, H, eps, dtype_, stream));
  if (m.layers.empty()) return Status::ok();
  // h holds layer_norm1 of x when a layer starts: the first one's here, the others' from the
  // previous layer's fused residual add.
  LITELLAMA_RETURN_IF_ERROR(launch_layer_norm(m.h.data(), m.x.data(), m.layers[0].ln1_w.as<float>(),
                                              m.layers[0].ln1_b.as<float>(), T, H, eps, dtype_,
                                              stream));
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const Layer& L = m.layers[l];
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.qkv.data(), m.h.data(), L.qkv_w.data(), T, 3 * H, H,
                                            dtype_, dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.qkv.data(), m.qkv.data(), L.qkv_b.as<float>(),
                                              nullptr, T, 3 * H, VisionActivation::kNone, dtype_,
                                              stream));
    LITELLAMA_RETURN_IF_ERROR(launch_dense_attention(m.attn.data(), m.qkv.data(),
                                                     m.attention_ws.data(), T, vc.n_heads, head_dim,
                                                     dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.h.data(), m.attn.data(), L.o_w.data(), T, H, H,
                                            dtype_, dtype_, blas, stream));
    // x += out_proj + bias; h = layer_norm2(x).
    LITELLAMA_RETURN_IF_ERROR(launch_bias_residual_layer_norm(
        m.x.data(), m.h.data(), L.o_b.as<float>(), m.h.data(), L.ln2_w.as<float>(),
        L.ln2_b.as<float>(), T, H, eps, dtype_, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.mid.data(), m.h.data(), L.fc1_w.data(), T, inter, H,
                                            dtype_, dtype_, blas, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.mid.data(), m.mid.data(), L.fc1_b.as<float>(),
                                              nullptr, T, inter, VisionActivation::kQuickGelu,
                                              dtype_, stream));
    LITELLAMA_RETURN_IF_ERROR(launch_linear(m.h.data(), m.mid.data(), L.fc2_w.data(), T, H, inter,
                                            dtype_, dtype_, blas, stream));
    if (l + 1 < m.layers.size()) {
      // x += fc2 + bias; h = the next layer's layer_norm1(x).
      const Layer& next = m.layers[l + 1];
      LITELLAMA_RETURN_IF_ERROR(launch_bias_residual_layer_norm(
          m.x.data(), m.h.data(), L.fc2_b.as<float>(), m.h.data(), next.ln1_w.as<float>(),
          next.ln1_b.as<float>(), T, H, eps, dtype_, stream));
    } else {
      LITELLAMA_RETURN_IF_ERROR(launch_bias_act(m.x.data(), m.h.data(), L.fc2_b.as<float>(),
                                                m.x.data(), T, H, VisionActivation::kNone, dtype_,
                                                stream));
    }
  }
  return Status::ok();
}

Status CudaVisionEncoder::run_projector_head() {
  Impl& m = *impl_;
  const cudaStream_t stream = m.ctx.stream();
  const int32_t H = config_.vision.hidden_size, th = config_.text_hidden_size;
  const int32_t n_rows = config_.n_image_tokens();
  const size_t e = dtype_size_bytes(dtype_);
  // The "default" strategy drops the class token's row: the features start at row 1.
  const void* features =
      config_.feature_select == VisionFeatureSelect::kDefault ? m.x.as<char>(H * e) : m.x.data();
  LITELLAMA_RETURN_IF_ERROR(launch_linear(m.mid.data(), features, m.proj1_w.data(), n_rows, th, H,
                                          dtype_, dtype_, m.ctx.linear(), stream));
  return launch_bias_act(m.mid.data(), m.mid.data(), m.proj1_b.as<float>(), nullptr, n_rows, th,
                         VisionActivation::kGeluErf, dtype_, stream);
}

Status CudaVisionEncoder::enqueue_tower_and_projector(float* dst, const DevicePoolRows* pool) {
  Impl& m = *impl_;
  const cudaStream_t stream = m.ctx.stream();
  LITELLAMA_RETURN_IF_ERROR(
      m.graphs.run(dst != nullptr ? kEncodeGraphKey : kFeaturesGraphKey, stream, [&]() -> Status {
        LITELLAMA_RETURN_IF_ERROR(run_tower());
        return dst != nullptr ? run_projector_head() : Status::ok();
      }));
  if (dst != nullptr) {
    // linear_2 writes float32 rows into the destination; its bias is added there.
    const int32_t th = config_.text_hidden_size, n_rows = config_.n_image_tokens();
    LITELLAMA_RETURN_IF_ERROR(launch_linear(dst, m.mid.data(), m.proj2_w.data(), n_rows, th, th,
                                            dtype_, DType::kF32, m.ctx.linear(), stream));
    LITELLAMA_RETURN_IF_ERROR(launch_bias_act(dst, dst, m.proj2_b.as<float>(), nullptr, n_rows, th,
                                              VisionActivation::kNone, DType::kF32, stream));
  }
  if (pool != nullptr) {
    LITELLAMA_RETURN_IF_ERROR(launch_write_device_time(pool->finished_ns(), stream));
    LITELLAMA_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(static_cast<cudaEvent_t>(pool->ready_event()), stream));
  }
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.ctx.step_end(), stream));
  m.in_flight = true;
  return Status::ok();
}

Status CudaVisionEncoder::enqueue_image(const RgbImage& image,
                                        const ClipPreprocessConfig& preprocess, float* dst,
                                        const DevicePoolRows* pool) {
  // The staging buffers of the encode in flight are rewritten below.
  LITELLAMA_RETURN_IF_ERROR(finish());
  LITELLAMA_RETURN_IF_ERROR(enqueue_preprocess(image, preprocess));
  return enqueue_tower_and_projector(dst, pool);
}

Status CudaVisionEncoder::encode_to_device(const PixelValues& pixels, float* dst) {
  LITELLAMA_RETURN_IF_ERROR(finish());
  LITELLAMA_RETURN_IF_ERROR(enqueue_patches(pixels));
  LITELLAMA_RETURN_IF_ERROR(enqueue_tower_and_projector(dst, nullptr));
  return finish();
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

Result<std::vector<float>> CudaVisionEncoder::preprocess_on_device(
    const RgbImage& image, const ClipPreprocessConfig& preprocess) {
  LITELLAMA_RETURN_IF_ERROR(finish());
  LITELLAMA_RETURN_IF_ERROR(enqueue_preprocess(image, preprocess));
  Impl& m = *impl_;
  LITELLAMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(m.ctx.stream()));
  const size_t n = m.patches.size_bytes() / dtype_size_bytes(dtype_);
  std::vector<char> stored(m.patches.size_bytes());
  LITELLAMA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(stored.data(), m.patches.data(), stored.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  convert_to_f32(out.data(), stored.data(), dtype_, n);
  return out;
}

Result<std::vector<float>> CudaVisionEncoder::vision_features(const PixelValues& pixels) {
  LITELLAMA_RETURN_IF_ERROR(finish());
  LITELLAMA_RETURN_IF_ERROR(enqueue_patches(pixels));
  LITELLAMA_RETURN_IF_ERROR(enqueue_tower_and_projector(nullptr, nullptr));
  LITELLAMA_RETURN_IF_ERROR(finish());
  Impl& m = *impl_;
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
