// RoPE frequency tables for every rope_scaling variant, computed on the host once (or, for
// dynamic NTK, per sequence length) and handed to the backends. Rotation is the "rotate half"
// convention of the Hugging Face Llama family: dimension i pairs with i + head_dim/2.
#pragma once

#include <cstdint>
#include <vector>

#include "services/worker/model_config.h"

namespace litellama {

// Inverse frequencies [head_dim / 2] for a sequence whose length after the current step is
// `seq_len` (only kDynamic depends on it: it grows the base once seq_len passes the original
// context, per sequence, so a sequence's result does not depend on its batch).
std::vector<float> rope_inv_freq(const ModelConfig& config, int64_t seq_len);

// Factor applied to cos and sin (YaRN's attention factor; 1 for the other variants).
float rope_attention_scaling(const ModelConfig& config);

// For kDynamic: the effective base theta for a sequence of length seq_len (equal to
// config.rope.theta while seq_len is within the original context). inv_freq[i] is
// base^(-2i/head_dim) then.
double rope_dynamic_base(const ModelConfig& config, int64_t seq_len);

}  // namespace litellama
