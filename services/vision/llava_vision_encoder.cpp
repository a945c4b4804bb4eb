#include "services/vision/llava_vision_encoder.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <thread>

#include "services/worker/checkpoint.h"

namespace litellama::vision {

namespace {

// Below this many multiply-adds a product runs on one thread.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

}  // namespace

std::vector<float> flatten_patches(const PixelValues& pixels, int32_t patch_size) {
  const int64_t p = patch_size, side = pixels.width / patch_size, img = pixels.width;
  const int64_t patch_len = 3 * p * p;
  // Flattened patches in the kernel's (channel, ky, kx) order; patch index y * side + x, the
  // order of the convolution output's flatten(2).
  std::vector<float> patches(static_cast<size_t>(side * side * patch_len));
  for (int64_t py = 0; py < side; ++py) {
    for (int64_t px = 0; px < side; ++px) {
      float* dst = patches.data() + (py * side + px) * patch_len;
      for (int64_t c = 0; c < 3; ++c) {
        for (int64_t ky = 0; ky < p; ++ky) {
          const float* src = pixels.data.data() + (c * img + py * p + ky) * img + px * p;
          std::copy_n(src, p, dst + (c * p + ky) * p);
        }
      }
    }
  }
  return patches;
}

Status check_pixel_values(const PixelValues& pixels, const ClipVisionConfig& vision) {
  if (pixels.height != vision.image_size || pixels.width != vision.image_size ||
      pixels.data.size() != static_cast<size_t>(3) * pixels.height * pixels.width) {
    return make_error(StatusCode::kInvalidArgument,
                      "pixel values are {}x{} but the vision tower takes {}x{} images",
                      pixels.width, pixels.height, vision.image_size, vision.image_size);
  }
  return Status::ok();
}

Result<std::unique_ptr<LlavaVisionEncoder>> LlavaVisionEncoder::load(const Checkpoint& ckpt,
                                                                     int32_t n_threads) {
  if (ckpt.llava() == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "'{}' is not a LLaVA checkpoint (no vision tower)", ckpt.dir());
  }
  std::unique_ptr<LlavaVisionEncoder> enc(new LlavaVisionEncoder());
  enc->config_ = *ckpt.llava();
  enc->n_threads_ = n_threads > 0
                        ? n_threads
                        : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const LlavaTensorNames& n = ckpt.llava_names();
  // Checkpoint::open validated every name and shape used here.
  auto get = [&](const std::string& name, std::vector<float>* dst) -> Status {
    LITELLAMA_ASSIGN_OR_RETURN(TensorView t, ckpt.tensor(name));
    *dst = t.to_f32();
    return Status::ok();
  };
  LITELLAMA_RETURN_IF_ERROR(get(n.vision("embeddings.class_embedding"), &enc->class_embedding_));
  LITELLAMA_RETURN_IF_ERROR(
      get(n.vision("embeddings.patch_embedding.weight"), &enc->patch_weight_));
  LITELLAMA_RETURN_IF_ERROR(
      get(n.vision("embeddings.position_embedding.weight"), &enc->position_embedding_));
  LITELLAMA_RETURN_IF_ERROR(get(n.vision("pre_layrnorm.weight"), &enc->pre_ln_w_));
  LITELLAMA_RETURN_IF_ERROR(get(n.vision("pre_layrnorm.bias"), &enc->pre_ln_b_));
  enc->layers_.resize(static_cast<size_t>(enc->config_.n_layers_used()));
  for (int32_t l = 0; l < enc->config_.n_layers_used(); ++l) {
    Layer& L = enc->layers_[static_cast<size_t>(l)];
    const std::pair<const char*, std::vector<float>*> tensors[] = {
        {"layer_norm1.weight", &L.ln1_w},     {"layer_norm1.bias", &L.ln1_b},
        {"self_attn.q_proj.weight", &L.wq},   {"self_attn.q_proj.bias", &L.bq},
        {"self_attn.k_proj.weight", &L.wk},   {"self_attn.k_proj.bias", &L.bk},
        {"self_attn.v_proj.weight", &L.wv},   {"self_attn.v_proj.bias", &L.bv},
        {"self_attn.out_proj.weight", &L.wo}, {"self_attn.out_proj.bias", &L.bo},
        {"layer_norm2.weight", &L.ln2_w},     {"layer_norm2.bias", &L.ln2_b},
        {"mlp.fc1.weight", &L.fc1_w},         {"mlp.fc1.bias", &L.fc1_b},
        {"mlp.fc2.weight", &L.fc2_w},         {"mlp.fc2.bias", &L.fc2_b},
    };
    for (const auto& [name, dst] : tensors) LITELLAMA_RETURN_IF_ERROR(get(n.layer(l, name), dst));
  }
  LITELLAMA_RETURN_IF_ERROR(get(n.projector("linear_1.weight"), &enc->proj1_w_));
  LITELLAMA_RETURN_IF_ERROR(get(n.projector("linear_2.weight"), &enc->proj2_w_));
  if (enc->config_.projector_bias) {
    LITELLAMA_RETURN_IF_ERROR(get(n.projector("linear_1.bias"), &enc->proj1_b_));
    LITELLAMA_RETURN_IF_ERROR(get(n.projector("linear_2.bias"), &enc->proj2_b_));
  }
  return enc;
}

void LlavaVisionEncoder::linear(float* out, const float* in, const std::vector<float>& w,
                                const std::vector<float>& bias, int64_t n_rows, int64_t n_out,
                                int64_t n_in) const {
  const bool parallel = n_rows * n_out * n_in >= kMinParallelMacs;
#pragma omp parallel for schedule(static) num_threads(n_threads_) if (parallel)
  for (int64_t o = 0; o < n_out; ++o) {
    const float* wr = w.data() + o * n_in;
    const float b = bias.empty() ? 0.0f : bias[static_cast<size_t>(o)];
    for (int64_t t = 0; t < n_rows; ++t) {
      const float* x = in + t * n_in;
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < n_in; ++k) acc += x[k] * wr[k];
      out[t * n_out + o] = acc + b;
    }
  }
}

void LlavaVisionEncoder::layer_norm(float* out, const float* in, const std::vector<float>& w,
                                    const std::vector<float>& b, int64_t n_rows,
                                    int64_t dim) const {
  const double eps = config_.vision.layer_norm_eps;
  for (int64_t t = 0; t < n_rows; ++t) {
    const float* x = in + t * dim;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += x[i];
    mean /= static_cast<double>(dim);
    for (int64_t i = 0; i < dim; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= static_cast<double>(dim);  // biased, as torch's LayerNorm
    const auto inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    const auto m = static_cast<float>(mean);
    for (int64_t i = 0; i < dim; ++i) out[t * dim + i] = (x[i] - m) * inv * w[i] + b[i];
  }
}

void LlavaVisionEncoder::attention(float* out, const float* q, const float* k, const float* v,
                                   int64_t n_tokens) const {
  const int64_t hidden = config_.vision.hidden_size, n_heads = config_.vision.n_heads;
  const int64_t hd = hidden / n_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool parallel = n_tokens * n_tokens * hidden >= kMinParallelMacs;
#pragma omp parallel num_threads(n_threads_) if (parallel)
  {
    std::vector<float> scores(static_cast<size_t>(n_tokens));
#pragma omp for collapse(2) schedule(static)
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* qv = q + t * hidden + h * hd;
        float max_score = -INFINITY;
        for (int64_t j = 0; j < n_tokens; ++j) {
          const float* kv = k + j * hidden + h * hd;
          float dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qv[i] * kv[i];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        float total = 0;
        for (int64_t j = 0; j < n_tokens; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          total += scores[j];
        }
        float* o = out + t * hidden + h * hd;
        std::fill(o, o + hd, 0.0f);
        for (int64_t j = 0; j < n_tokens; ++j) {
          const float p = scores[j] / total;
          const float* vv = v + j * hidden + h * hd;
          for (int64_t i = 0; i < hd; ++i) o[i] += p * vv[i];
        }
      }
    }
  }
}

Result<std::vector<float>> LlavaVisionEncoder::vision_features(const PixelValues& pixels) const {
  const ClipVisionConfig& vc = config_.vision;
  LITELLAMA_RETURN_IF_ERROR(check_pixel_values(pixels, vc));
  const int64_t H = vc.hidden_size, p = vc.patch_size;
  const int64_t n_patches = vc.n_patches(), T = vc.n_positions(), inter = vc.intermediate_size;
  const int64_t patch_len = 3 * p * p;
  const std::vector<float> patches = flatten_patches(pixels, static_cast<int32_t>(p));
  std::vector<float> x(static_cast<size_t>(T * H)), h(x.size());
  std::copy(class_embedding_.begin(), class_embedding_.end(), x.begin());
  linear(x.data() + H, patches.data(), patch_weight_, {}, n_patches, H, patch_len);
  for (size_t i = 0; i < x.size(); ++i) x[i] += position_embedding_[i];
  layer_norm(x.data(), x.data(), pre_ln_w_, pre_ln_b_, T, H);

  std::vector<float> q(x.size()), k(x.size()), v(x.size()), attn(x.size()), o(x.size());
  std::vector<float> mid(static_cast<size_t>(T * inter));
  for (const Layer& L : layers_) {
    layer_norm(h.data(), x.data(), L.ln1_w, L.ln1_b, T, H);
    linear(q.data(), h.data(), L.wq, L.bq, T, H, H);
    linear(k.data(), h.data(), L.wk, L.bk, T, H, H);
    linear(v.data(), h.data(), L.wv, L.bv, T, H, H);
    attention(attn.data(), q.data(), k.data(), v.data(), T);
    linear(o.data(), attn.data(), L.wo, L.bo, T, H, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    layer_norm(h.data(), x.data(), L.ln2_w, L.ln2_b, T, H);
    linear(mid.data(), h.data(), L.fc1_w, L.fc1_b, T, inter, H);
    for (float& m : mid) m = m / (1.0f + std::exp(-1.702f * m));  // quick_gelu
    linear(o.data(), mid.data(), L.fc2_w, L.fc2_b, T, H, inter);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
  if (config_.feature_select == VisionFeatureSelect::kDefault) x.erase(x.begin(), x.begin() + H);
  return x;
}

Result<std::vector<float>> LlavaVisionEncoder::project(const std::vector<float>& features) const {
  const int64_t H = config_.vision.hidden_size, th = config_.text_hidden_size;
  if (features.empty() || features.size() % static_cast<size_t>(H) != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "{} feature values are not whole rows of the vision hidden size {}",
                      features.size(), H);
  }
  const auto n_rows = static_cast<int64_t>(features.size()) / H;
  std::vector<float> mid(static_cast<size_t>(n_rows * th)), out(mid.size());
  linear(mid.data(), features.data(), proj1_w_, proj1_b_, n_rows, th, H);
  for (float& m : mid) m = 0.5f * m * (1.0f + std::erf(m / std::numbers::sqrt2_v<float>));
  linear(out.data(), mid.data(), proj2_w_, proj2_b_, n_rows, th, th);
  return out;
}

Result<std::vector<float>> LlavaVisionEncoder::encode(const PixelValues& pixels) const {
  LITELLAMA_ASSIGN_OR_RETURN(std::vector<float> features, vision_features(pixels));
  return project(features);
}

}  // namespace litellama::vision
