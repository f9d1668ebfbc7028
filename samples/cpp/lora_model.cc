#include "lora_model.h"

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace torchrr::samples {

namespace {

using torch::indexing::Slice;

constexpr std::array kBugs = {
    BugInfo{Bug::kNone, "none", "no bug: trains cleanly"},
    BugInfo{Bug::kResidualAdd, "residual_add",
            "`x += attn_out` onto a layer input the RMSNorm saved (needs --layers >= 2)"},
    BugInfo{Bug::kInplaceActivation, "inplace_activation",
            "SiLU as sigmoid then mul_ in place on the sigmoid's saved output"},
    BugInfo{Bug::kSoftmaxMask, "softmax_mask",
            "masked_fill_ on the attention softmax's saved output"},
    BugInfo{Bug::kOptimizerBeforeBackward, "optimizer_before_backward",
            "optimizer.step() between forward and backward (raises at step 1)"},
    BugInfo{Bug::kSliceAssign, "slice_assign",
            "slice assignment into the RoPE table cache the rotation saved"},
    BugInfo{Bug::kViewWrite, "view_write",
            "zero_() through a select() view of the saved log-softmax output"},
    BugInfo{Bug::kTwoWrites, "two_writes",
            "final RMSNorm in place: two mul_ into the input its pow saved"},
    BugInfo{Bug::kSilentRawWrite, "silent_raw_write",
            "an extension-style kernel rescales the MLP's up projection through its raw pointer "
            "after the product saved it (no error: silently wrong gradients)"},
};

// [x1, x2] -> [-x2, x1] over the last dimension.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// What a custom extension's fused kernel does when it works on raw memory: a tensor over the same
// bytes (from_blob: another storage, another version counter) written in place. Autograd cannot
// see it.
void ScaleThroughRawPointer(const torch::Tensor& t, double scale) {
  torch::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().requires_grad(false))
      .mul_(scale);
}

// A frozen parameter: part of the model's state, never trained.
torch::Tensor RegisterFrozen(torch::nn::Module& module, const std::string& name,
                             torch::Tensor value) {
  return module.register_parameter(name, std::move(value), /*requires_grad=*/false);
}

}  // namespace

std::span<const BugInfo> AllBugs() { return kBugs; }

std::optional<Bug> ParseBug(std::string_view name) {
  for (const BugInfo& info : kBugs) {
    if (info.name == name) return info.bug;
  }
  return std::nullopt;
}

LoraLinearImpl::LoraLinearImpl(int64_t in_features, int64_t out_features, int64_t rank,
                               double alpha)
    : scaling_(alpha / static_cast<double>(rank)) {
  weight_ = RegisterFrozen(*this, "weight", torch::randn({out_features, in_features}) * 0.02);
  // PEFT's initialisation: A as nn.Linear's default (Kaiming uniform, a = sqrt(5)), B zero.
  auto lora_a = torch::empty({rank, in_features});
  torch::nn::init::kaiming_uniform_(lora_a, std::sqrt(5.0));
  lora_a_ = register_parameter("lora_a", lora_a);
  lora_b_ = register_parameter("lora_b", torch::zeros({out_features, rank}));
}

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  auto base = torch::linear(x, weight_);
  auto down = torch::linear(x, lora_a_);
  auto up = torch::linear(down, lora_b_);  // VICTIM(optimizer_before_backward)
  return base + up * scaling_;
}

RmsNormImpl::RmsNormImpl(int64_t hidden_size, double eps, bool in_place)
    : eps_(eps), in_place_(in_place) {
  weight_ = RegisterFrozen(*this, "weight", torch::ones({hidden_size}));
}

torch::Tensor RmsNormImpl::forward(torch::Tensor x) {
  auto inv_rms = torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps_);  // VICTIM(two_writes)
  if (in_place_) {
    // Normalize the input itself: the caller has no other use for it, and a buffer is spared.
    x.mul_(inv_rms);         // BUG(two_writes)
    return x.mul_(weight_);  // BUG2(two_writes)
  }
  return x * inv_rms * weight_;  // VICTIM(residual_add)
}

RotaryEmbeddingImpl::RotaryEmbeddingImpl(const LlamaConfig& config, Bug bug) : bug_(bug) {
  const int64_t head_dim = config.hidden_size / config.num_heads;
  auto exponents = torch::arange(0, head_dim, 2, torch::kFloat64) / static_cast<double>(head_dim);
  inv_freq_ =
      register_buffer("inv_freq", torch::pow(config.rope_theta, -exponents).to(torch::kFloat));
  cache_ = register_buffer("cache", torch::zeros({2, config.max_seq_len, head_dim}));
}

torch::Tensor RotaryEmbeddingImpl::Tables(int64_t seq) {
  auto positions = torch::arange(seq, inv_freq_.options());
  auto angles = torch::outer(positions, inv_freq_);
  angles = torch::cat({angles, angles}, -1);
  auto tables = torch::stack({angles.cos(), angles.sin()});
  if (bug_ == Bug::kSliceAssign) {
    // Keep the tables in the preallocated cache instead of allocating them on every call.
    cache_.index_put_({Slice(), Slice(0, seq)}, tables);  // BUG(slice_assign)
    return cache_.narrow(1, 0, seq);
  }
  return tables;
}

torch::Tensor RotaryEmbeddingImpl::forward(const torch::Tensor& x) {
  auto tables = Tables(x.size(-2));
  auto cos = tables[0];
  auto sin = tables[1];
  return x * cos + RotateHalf(x) * sin;  // VICTIM(slice_assign)
}

AttentionImpl::AttentionImpl(const LlamaConfig& config, RotaryEmbedding rotary, Bug bug)
    : num_heads_(config.num_heads),
      head_dim_(config.hidden_size / config.num_heads),
      rotary_(std::move(rotary)),
      bug_(bug) {
  const int64_t hidden = config.hidden_size;
  auto make_proj = [&](const char* name) {
    return register_module(name, LoraLinear(hidden, hidden, config.lora_rank, config.lora_alpha));
  };
  q_proj_ = make_proj("q_proj");
  k_proj_ = make_proj("k_proj");
  v_proj_ = make_proj("v_proj");
  o_proj_ = make_proj("o_proj");
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  auto split_heads = [&](const torch::Tensor& t) {
    return t.view({batch, seq, num_heads_, head_dim_}).transpose(1, 2);
  };
  auto q = rotary_->forward(split_heads(q_proj_->forward(x)));
  auto k = rotary_->forward(split_heads(k_proj_->forward(x)));
  auto v = split_heads(v_proj_->forward(x));

  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  auto future = torch::ones({seq, seq}, x.options().dtype(torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores, -1);  // VICTIM(softmax_mask)
  if (bug_ == Bug::kSoftmaxMask) {
    // Make sure no attention leaks to future positions.
    probs.masked_fill_(future, 0.0);  // BUG(softmax_mask)
  }
  auto out = torch::matmul(probs, v).transpose(1, 2).reshape({batch, seq, -1});
  return o_proj_->forward(out);
}

MlpImpl::MlpImpl(const LlamaConfig& config, Bug bug) : bug_(bug) {
  const int64_t hidden = config.hidden_size;
  const int64_t inter = config.intermediate_size;
  gate_proj_ =
      register_module("gate_proj", LoraLinear(hidden, inter, config.lora_rank, config.lora_alpha));
  up_proj_ =
      register_module("up_proj", LoraLinear(hidden, inter, config.lora_rank, config.lora_alpha));
  down_proj_ =
      register_module("down_proj", LoraLinear(inter, hidden, config.lora_rank, config.lora_alpha));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto gate = gate_proj_->forward(x);
  auto up = up_proj_->forward(x);
  torch::Tensor act;
  if (bug_ == Bug::kInplaceActivation) {
    // SiLU(g) = g * sigmoid(g), multiplied in place to spare a buffer.
    act = torch::sigmoid(gate);  // VICTIM(inplace_activation)
    act.mul_(gate);              // BUG(inplace_activation)
  } else {
    act = torch::silu(gate);
  }
  auto hidden = act * up;  // VICTIM(silent_raw_write)
  if (bug_ == Bug::kSilentRawWrite) {
    ScaleThroughRawPointer(up, 0.5);  // BUG(silent_raw_write)
  }
  return down_proj_->forward(hidden);
}

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& config, RotaryEmbedding rotary, Bug bug)
    : bug_(bug) {
  input_norm_ = register_module("input_norm", RmsNorm(config.hidden_size, config.rms_norm_eps));
  self_attn_ = register_module("self_attn", Attention(config, std::move(rotary), bug));
  post_attention_norm_ =
      register_module("post_attention_norm", RmsNorm(config.hidden_size, config.rms_norm_eps));
  mlp_ = register_module("mlp", Mlp(config, bug));
}

torch::Tensor DecoderLayerImpl::forward(torch::Tensor x) {
  auto attn_out = self_attn_->forward(input_norm_->forward(x));
  if (bug_ == Bug::kResidualAdd) {
    x += attn_out;  // BUG(residual_add)
  } else {
    x = x + attn_out;
  }
  return x + mlp_->forward(post_attention_norm_->forward(x));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config, Bug bug)
    : config_(config), bug_(bug) {
  embed_tokens_ = RegisterFrozen(*this, "embed_tokens",
                                 torch::randn({config.vocab_size, config.hidden_size}) * 0.02);
  rotary_ = register_module("rotary", RotaryEmbedding(config, bug));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) {
    layers_->push_back(DecoderLayer(config, rotary_, bug));
  }
  final_norm_ = register_module("final_norm", RmsNorm(config.hidden_size, config.rms_norm_eps,
                                                      /*in_place=*/bug == Bug::kTwoWrites));
  lm_head_ = RegisterFrozen(*this, "lm_head",
                            torch::randn({config.vocab_size, config.hidden_size}) * 0.02);
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens,
                                            const torch::Tensor& labels) {
  auto h = torch::embedding(embed_tokens_, tokens);
  for (const auto& layer : *layers_) h = layer->as<DecoderLayer>()->forward(h);
  auto logits = torch::linear(final_norm_->forward(h), lm_head_);

  // Cross-entropy with label smoothing: (1 - eps) * nll + eps * mean over the vocabulary.
  auto log_probs = torch::log_softmax(logits, -1);  // VICTIM(view_write)
  if (bug_ == Bug::kViewWrite) {
    // Padding is never a target: keep it out of the smoothing term.
    log_probs.select(-1, config_.pad_token_id).zero_();  // BUG(view_write)
  }
  auto nll = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1);
  auto smooth = -log_probs.mean(-1);
  const double eps = config_.label_smoothing;
  return ((1.0 - eps) * nll + eps * smooth).mean();
}

std::vector<torch::Tensor> LlamaForCausalLMImpl::LoraParameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& item : named_parameters()) {
    if (item.value().requires_grad()) params.push_back(item.value());
  }
  return params;
}

}  // namespace torchrr::samples
