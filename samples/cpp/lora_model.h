// A small Llama-like decoder fine-tuned with LoRA, and the in-place mistakes the sample can plant.
//
// The base weights (embedding, projections, norms, LM head) are frozen; only the LoRA adapters on
// the q, k, v, o, gate, up and down projections train. Each planted mistake is a single line of
// this model (or of the training step in lora_step.cc) marked `// BUG(<name>)`; the forward op
// whose saved tensor it breaks is marked `// VICTIM(<name>)`. samples/README.md has the table.
#ifndef TORCHRR_SAMPLES_CPP_LORA_MODEL_H_
#define TORCHRR_SAMPLES_CPP_LORA_MODEL_H_

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace torchrr::samples {

// An in-place mistake to plant. Every one but kNone and the silent ones makes loss.backward()
// raise PyTorch's "one of the variables needed for gradient computation has been modified by an
// inplace operation". A silent one (name "silent_...") writes into a saved tensor's memory
// behind autograd's back: nothing raises and the gradients are wrong; only torchrr record
// --verify-saved sees it.
enum class Bug {
  kNone,
  kResidualAdd,  // Needs 2 layers or more.
  kInplaceActivation,
  kSoftmaxMask,
  kOptimizerBeforeBackward,  // Raises at step 1: step 0 has no gradients to apply yet.
  kSliceAssign,
  kViewWrite,
  kTwoWrites,
  kSilentRawWrite,
};

struct BugInfo {
  Bug bug;
  std::string_view name;  // As given to --bug.
  std::string_view description;
};

// Every bug, kNone first.
std::span<const BugInfo> AllBugs();

// The bug called `name`, or nullopt when there is none.
std::optional<Bug> ParseBug(std::string_view name);

struct LlamaConfig {
  int64_t vocab_size = 512;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 352;  // About 8/3 of hidden_size, as Llama, rounded up to 32.
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t max_seq_len = 64;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t lora_rank = 8;
  double lora_alpha = 16.0;
  int64_t pad_token_id = 0;  // Never a target in the synthetic batches.
  double label_smoothing = 0.1;
};

// A frozen linear layer plus a trainable low-rank update: y = x W^T + (alpha / r) x A^T B^T.
// B starts at zero (as PEFT does), so the adapted model starts out equal to the base model.
class LoraLinearImpl : public torch::nn::Module {
 public:
  LoraLinearImpl(int64_t in_features, int64_t out_features, int64_t rank, double alpha);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;  // [out, in], frozen.
  torch::Tensor lora_a_;  // [rank, in], trained.
  torch::Tensor lora_b_;  // [out, rank], trained.
  double scaling_;
};
TORCH_MODULE(LoraLinear);

// Root-mean-square layer norm with a frozen scale.
class RmsNormImpl : public torch::nn::Module {
 public:
  // in_place: normalize the input tensor itself (for an input nobody else reads).
  RmsNormImpl(int64_t hidden_size, double eps, bool in_place = false);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::Tensor weight_;  // [hidden], frozen.
  double eps_;
  bool in_place_;
};
TORCH_MODULE(RmsNorm);

// Rotary position embeddings (RoPE) over the head dimension, rotate-half convention.
class RotaryEmbeddingImpl : public torch::nn::Module {
 public:
  RotaryEmbeddingImpl(const LlamaConfig& config, Bug bug);
  // x: [batch, heads, seq, head_dim]; returns x rotated by its positions.
  torch::Tensor forward(const torch::Tensor& x);

 private:
  // The cos and sin tables for positions [0, seq), stacked: [2, seq, head_dim].
  torch::Tensor Tables(int64_t seq);

  torch::Tensor inv_freq_;  // [head_dim / 2].
  torch::Tensor cache_;     // [2, max_seq_len, head_dim]; only kSliceAssign fills it.
  Bug bug_;
};
TORCH_MODULE(RotaryEmbedding);

// Causal multi-head self-attention.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const LlamaConfig& config, RotaryEmbedding rotary, Bug bug);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t num_heads_;
  int64_t head_dim_;
  LoraLinear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  RotaryEmbedding rotary_;  // Shared by every layer; registered by the model.
  Bug bug_;
};
TORCH_MODULE(Attention);

// SwiGLU feed-forward: down(silu(gate(x)) * up(x)).
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const LlamaConfig& config, Bug bug);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  LoraLinear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
  Bug bug_;
};
TORCH_MODULE(Mlp);

// Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x)).
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const LlamaConfig& config, RotaryEmbedding rotary, Bug bug);
  torch::Tensor forward(torch::Tensor x);

 private:
  RmsNorm input_norm_{nullptr}, post_attention_norm_{nullptr};
  Attention self_attn_{nullptr};
  Mlp mlp_{nullptr};
  Bug bug_;
};
TORCH_MODULE(DecoderLayer);

// The decoder with its LM head and a label-smoothed next-token cross-entropy loss.
class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  LlamaForCausalLMImpl(const LlamaConfig& config, Bug bug);

  // tokens, labels: [batch, seq] int64 on the model's device. Returns the mean loss (a scalar).
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& labels);

  // The trainable parameters: every LoRA A and B.
  std::vector<torch::Tensor> LoraParameters() const;

 private:
  LlamaConfig config_;
  torch::Tensor embed_tokens_;  // [vocab, hidden], frozen.
  RotaryEmbedding rotary_{nullptr};
  torch::nn::ModuleList layers_{nullptr};  // Of DecoderLayer.
  RmsNorm final_norm_{nullptr};
  torch::Tensor lm_head_;  // [vocab, hidden], frozen.
  Bug bug_;
};
TORCH_MODULE(LlamaForCausalLM);

}  // namespace torchrr::samples

#endif  // TORCHRR_SAMPLES_CPP_LORA_MODEL_H_
