// lora_step: LoRA fine-tuning steps of a small Llama-like model on a synthetic batch, with an
// optional in-place mistake planted (--bug) and an optional torchrr recording (--trace).
//
// Prints each step's loss with every digit of its float value, so two runs compare bit for bit.
// Exit codes: 0 trained; 1 PyTorch raised (printed as `error: ...` on stderr); 2 bad usage.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "lora_model.h"

#ifdef TORCHRR_SAMPLE_HAS_RECORDER
#include <torchrr/recorder.h>
#endif

namespace {

using torchrr::samples::Bug;
using torchrr::samples::LlamaConfig;
using torchrr::samples::LlamaForCausalLM;

// Llama 2 7B's sizes (--shape 7b): the model whose one-step trace must fit in an issue attachment.
constexpr int64_t k7bLayers = 32;
constexpr int64_t k7bHidden = 4096;
constexpr int64_t k7bHeads = 32;
constexpr int64_t k7bIntermediate = 11008;
constexpr int64_t k7bVocab = 32000;
constexpr int64_t k7bSeq = 2048;
constexpr int64_t k7bRank = 16;
// --tiny divides the sizes no op depends on by this: the op stream stays that of the full shape
// (the same ops, layers, heads and LoRA rank) while every tensor fits in a few megabytes.
// 64 keeps 7B's head dimension even (4096 / 64 / 32 heads = 2), as RoPE needs.
constexpr int64_t kTinyDivisor = 64;

// One training step on (tokens, labels); returns the loss before the update.
// Throws c10::Error when backward finds a saved tensor modified in place.
double TrainStep(LlamaForCausalLM& model, torch::optim::Optimizer& optimizer,
                 const torch::Tensor& tokens, const torch::Tensor& labels, Bug bug) {
  auto loss = model->forward(tokens, labels);
  if (bug == Bug::kOptimizerBeforeBackward) {
    // Apply the previous step's gradients, then compute this step's.
    optimizer.step();  // BUG(optimizer_before_backward)
    optimizer.zero_grad();
    loss.backward();
  } else {
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
  }
  return loss.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  LlamaConfig config;
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  int steps = 3;
  std::string trace_path;
  std::string bug_name = "none";
  bool list_bugs = false;
  int64_t batch = 4;
  int64_t seed = 0;
  double learning_rate = 1e-2;
  std::string shape = "small";
  bool tiny = false;

  CLI::App app{
      "A LoRA fine-tuning step of a small Llama-like model, optionally with an in-place "
      "autograd bug planted (--list-bugs) and recorded by torchrr (--trace)."};
  app.add_option("--device", device_name, "cuda or cpu (default: cuda when available)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app.add_option("--steps", steps, "training steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--trace", trace_path, "record the steps with torchrr into this file");
  app.add_option("--bug", bug_name, "in-place mistake to plant, or none")->capture_default_str();
  app.add_flag("--list-bugs", list_bugs, "list the bugs --bug accepts and exit");
  app.add_option("--layers", config.num_layers, "decoder layers")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--hidden", config.hidden_size, "hidden size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--intermediate", config.intermediate_size,
                 "MLP intermediate size (default: 8/3 of hidden, rounded up to 32)")
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", config.num_heads, "attention heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seq", config.max_seq_len, "sequence length")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--vocab", config.vocab_size, "vocabulary size")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--rank", config.lora_rank, "LoRA rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", learning_rate, "AdamW learning rate")->capture_default_str();
  app.add_option("--seed", seed, "seed of the weights and the batch")->capture_default_str();
  app.add_option("--shape", shape,
                 "sizes the options above do not give: small (their defaults) or 7b (Llama 2 7B: "
                 "32 layers, hidden 4096, 32 heads, MLP 11008, vocab 32000, seq 2048, rank 16)")
      ->check(CLI::IsMember({"small", "7b"}))
      ->capture_default_str();
  app.add_flag("--tiny", tiny,
               "divide hidden, MLP, vocab and seq by 64: the ops of that shape on small tensors");
  CLI11_PARSE(app, argc, argv);

  if (list_bugs) {
    for (const auto& info : torchrr::samples::AllBugs()) {
      std::printf("%-26s %s\n", std::string(info.name).c_str(),
                  std::string(info.description).c_str());
    }
    return 0;
  }
  const std::optional<Bug> bug = torchrr::samples::ParseBug(bug_name);
  if (!bug) {
    std::cerr << "error: unknown bug '" << bug_name << "' (see --list-bugs)\n";
    return 2;
  }
  if (shape == "7b") {
    // An option given on the command line wins over the preset.
    auto preset = [&app](const char* option, int64_t& field, int64_t value) {
      if (app.count(option) == 0) field = value;
    };
    preset("--layers", config.num_layers, k7bLayers);
    preset("--hidden", config.hidden_size, k7bHidden);
    preset("--heads", config.num_heads, k7bHeads);
    preset("--intermediate", config.intermediate_size, k7bIntermediate);
    preset("--vocab", config.vocab_size, k7bVocab);
    preset("--seq", config.max_seq_len, k7bSeq);
    preset("--rank", config.lora_rank, k7bRank);
  }
  if (app.count("--intermediate") == 0 && shape != "7b") {
    // Llama's 8/3 ratio, rounded up to a multiple of 32.
    config.intermediate_size = (config.hidden_size * 8 / 3 + 31) / 32 * 32;
  }
  if (tiny) {
    for (int64_t* size : {&config.hidden_size, &config.intermediate_size, &config.vocab_size,
                          &config.max_seq_len}) {
      *size = std::max<int64_t>(*size / kTinyDivisor, 2);
    }
  }
  const int64_t head_dim = config.hidden_size / config.num_heads;
  if (config.hidden_size % config.num_heads != 0 || head_dim % 2 != 0) {
    std::cerr << "error: --hidden must be a multiple of --heads with an even quotient (RoPE)\n";
    return 2;
  }
  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "error: --device cuda: no CUDA device available\n";
    return 2;
  }
#ifndef TORCHRR_SAMPLE_HAS_RECORDER
  if (!trace_path.empty()) {
    std::cerr << "error: --trace: this lora_step was built without torchrr's recorder\n";
    return 2;
  }
#endif
  const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);

  // Weights and batch are drawn on the CPU, so every device starts from the same numbers.
  torch::manual_seed(seed);
  LlamaForCausalLM model(config, *bug);
  model->to(device);
  // Tokens 1..vocab-1: the padding token 0 never appears. Labels are the next tokens.
  auto sequence =
      torch::randint(1, config.vocab_size, {batch, config.max_seq_len + 1}, torch::kLong);
  auto tokens = sequence.narrow(1, 0, config.max_seq_len).to(device);
  auto labels = sequence.narrow(1, 1, config.max_seq_len).to(device);
  torch::optim::AdamW optimizer(model->LoraParameters(), torch::optim::AdamWOptions(learning_rate));

#ifdef TORCHRR_SAMPLE_HAS_RECORDER
  std::optional<torchrr::Recorder> recorder;
  if (!trace_path.empty()) {
    torchrr::RecorderOptions options;
    options.path = trace_path;
    recorder.emplace(options);
  }
#endif

  try {
    for (int step = 0; step < steps; ++step) {
      const double loss = TrainStep(model, optimizer, tokens, labels, *bug);
      std::printf("step %d loss %.17g\n", step, loss);
      std::fflush(stdout);
    }
  } catch (const c10::Error& e) {
#ifdef TORCHRR_SAMPLE_HAS_RECORDER
    if (recorder) recorder->RecordError("c10::Error", e.what_without_backtrace());
#endif
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
