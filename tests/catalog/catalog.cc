// catalog_case: a catalog of in-place autograd bug patterns, each a few lines of realistic
// training code, for checking what `torchrr replay` says about each against the source.
//
//   catalog_case NAME     run one case
//   catalog_case --list   print every case as `NAME CATEGORY` (bug, legal or silent)
//
// Categories:
//   bug     PyTorch raises "modified by an inplace operation" in backward. The line that wrote
//           the saved tensor is marked `// CULPRIT(<name>)` (later writes `// LATER(<name>)`),
//           the forward line whose op saved it `// VICTIM(<name>)`; helper calls on the way to
//           a culprit are marked `// CALLER(<name>)`. expected.tsv holds the node and versions.
//   legal   in-place ops autograd accepts; trains without error.
//   silent  a write PyTorch cannot see (through variable_data(), the C++ `.data`): no error,
//           a wrong gradient; the replayer reports a violation of kind "silent".
//
// Exit codes: 0 the case ran without error; 1 PyTorch raised a c10::Error (printed to stderr
// as `error: <message>`); 2 usage (unknown case).
//
// run_catalog.py finds the markers by scanning this file: keep each marker on the line of the
// call that does the work, and one marker of a kind per case (LATER and CALLER excepted).
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

using torch::indexing::Slice;

enum class Category { kBug, kLegal, kSilent };

struct Case {
  std::string_view name;
  Category category;
  std::function<void()> run;
};

// A trainable leaf.
torch::Tensor Param(at::IntArrayRef shape) { return torch::randn(shape).requires_grad_(); }

// --- bug: a saved input modified by `+=` --------------------------------------------------------
// A gated residual block: mul saves both of its inputs, then the residual is added in place.
void AddInplaceSavedInput() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto gate = Param({8});
  auto h = torch::matmul(x, w);
  auto gated = h * gate;  // VICTIM(add_inplace_saved_input)
  h += x;  // CULPRIT(add_inplace_saved_input)
  (gated.sum() + h.sum()).backward();
}

// --- bug: relu_ on tanh's output ----------------------------------------------------------------
void ReluAfterTanh() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto a = torch::tanh(torch::matmul(x, w));  // VICTIM(relu_after_tanh)
  a.relu_();  // CULPRIT(relu_after_tanh)
  a.pow(2).mean().backward();
}

// --- bug: masking a softmax output in place -----------------------------------------------------
void SoftmaxMaskedFill() {
  auto q = Param({2, 5, 4});
  auto k = Param({2, 5, 4});
  auto v = torch::randn({2, 5, 4});
  auto scores = torch::bmm(q, k.transpose(1, 2)) / 2.0;
  auto probs = torch::softmax(scores, -1);  // VICTIM(softmax_masked_fill)
  auto future = torch::ones({5, 5}, torch::kBool).triu(1);
  probs.masked_fill_(future, 0.0);  // CULPRIT(softmax_masked_fill)
  torch::bmm(probs, v).sum().backward();
}

// --- bug: the GAN pattern -----------------------------------------------------------------------
// D's step runs between D's backward (graph retained) and G's backward through the same D
// forward: G's backward needs D's weights as they were.
struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl()
      : hidden(register_module("hidden", torch::nn::Linear(6, 16))),
        out(register_module("out", torch::nn::Linear(16, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::leaky_relu(hidden(x), 0.2);
    return torch::sigmoid(out(h));  // VICTIM(gan_discriminator_step)
  }
  torch::nn::Linear hidden;
  torch::nn::Linear out;
};
TORCH_MODULE(Discriminator);

void GanDiscriminatorStep() {
  torch::nn::Linear generator(3, 6);
  Discriminator discriminator;
  torch::optim::Adam g_opt(generator->parameters(), torch::optim::AdamOptions(1e-3));
  // Adam updates in place (mul_, addcdiv_); libtorch's SGD writes through p.data() instead,
  // which PyTorch cannot see (silent_sgd_step_before_backward).
  torch::optim::Adam d_opt(discriminator->parameters(), torch::optim::AdamOptions(1e-3));
  auto z = torch::randn({8, 3});
  auto real = torch::randn({8, 6});
  auto ones = torch::ones({8, 1});
  auto zeros = torch::zeros({8, 1});

  auto fake = generator(z);
  auto d_fake = discriminator(fake);
  auto d_real = discriminator(real);
  auto d_loss = torch::binary_cross_entropy(d_real, ones) +
                torch::binary_cross_entropy(d_fake, zeros);
  d_opt.zero_grad();
  d_loss.backward({}, /*retain_graph=*/true);
  d_opt.step();  // CULPRIT(gan_discriminator_step)

  auto g_loss = torch::binary_cross_entropy(d_fake, ones);
  g_opt.zero_grad();
  g_loss.backward();
  g_opt.step();
}

// --- bug: a recurrent state clamped in place after the matmul that saved it ---------------------
void RnnClampState() {
  auto w_ih = Param({3, 5});
  auto w_hh = Param({5, 5});
  auto xs = torch::randn({4, 2, 3});
  auto h = torch::zeros({2, 5});
  for (int64_t t = 0; t < xs.size(0); ++t) {
    auto pre = torch::matmul(xs[t], w_ih) + torch::matmul(h, w_hh);  // VICTIM(rnn_clamp_state)
    h.clamp_(-0.5, 0.5);  // CULPRIT(rnn_clamp_state)
    h = torch::tanh(pre);
  }
  h.sum().backward();
}

// --- bug: the write is two helper calls deep ----------------------------------------------------
void SubtractMean(torch::Tensor& features) {
  features.sub_(features.mean(0, /*keepdim=*/true));  // CULPRIT(inplace_in_nested_helper)
}

void Standardize(torch::Tensor& features) {
  SubtractMean(features);  // CALLER(inplace_in_nested_helper)
}

void InplaceInNestedHelper() {
  auto x = torch::randn({6, 4});
  auto w = Param({4, 4});
  auto features = torch::matmul(x, w);
  auto waves = torch::sin(features);  // VICTIM(inplace_in_nested_helper)
  Standardize(features);  // CALLER(inplace_in_nested_helper)
  (waves.sum() + features.pow(2).sum()).backward();
}

// --- bug: two writes to one saved tensor --------------------------------------------------------
void TwoWrites() {
  auto x = torch::randn({4, 6});
  auto w = Param({6, 6});
  auto h = torch::matmul(x, w);
  auto y = torch::cos(h);  // VICTIM(two_writes)
  h.mul_(0.5);  // CULPRIT(two_writes)
  h.add_(1.0);  // LATER(two_writes)
  (y.sum() + h.sum()).backward();
}

// --- bug: sigmoid's output scaled in place ------------------------------------------------------
void SigmoidMul() {
  auto x = torch::randn({4, 8});
  auto w_gate = Param({8, 8});
  auto w_up = Param({8, 8});
  auto gate = torch::sigmoid(torch::matmul(x, w_gate));  // VICTIM(sigmoid_mul)
  auto up = torch::matmul(x, w_up);
  gate.mul_(up);  // CULPRIT(sigmoid_mul)
  gate.sum().backward();
}

// --- bug: exp's output clamped in place ---------------------------------------------------------
void ExpOutputModified() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 3});
  auto rates = torch::exp(torch::matmul(x, w));  // VICTIM(exp_output_modified)
  rates.clamp_max_(10.0);  // CULPRIT(exp_output_modified)
  torch::poisson_nll_loss(rates, torch::ones({4, 3}), /*log_input=*/false, /*full=*/false,
                          1e-8, at::Reduction::Mean)
      .backward();
}

// --- bug: a write through a view of a saved tensor ----------------------------------------------
void ViewWrite() {
  auto x = torch::randn({4, 6});
  auto w = Param({6, 6});
  auto energy = torch::matmul(x, w).pow(2) + 1.0;
  auto amplitude = torch::sqrt(energy);  // VICTIM(view_write)
  amplitude.narrow(1, 0, 1).fill_(0.0);  // CULPRIT(view_write)
  amplitude.sum().backward();
}

// --- bug: index_put_ of a slice into a saved tensor ---------------------------------------------
void IndexPutSlice() {
  auto tokens = torch::randn({3, 5, 4});
  auto proj = Param({4, 4});
  auto query = Param({4});
  auto cls = Param({4});
  auto embedded = torch::matmul(tokens, proj);
  auto scores = embedded * query;  // VICTIM(index_put_slice)
  embedded.index_put_({Slice(), 0}, cls);  // CULPRIT(index_put_slice)
  (scores.sum() + embedded.sum()).backward();
}

// --- bug: a frozen weight updated in place between forward and backward ------------------------
// The weight never required grad, so PyTorch's message names no node.
void FrozenWeightUpdate() {
  auto x = Param({4, 6});
  auto frozen = torch::randn({6, 6});  // requires_grad false: a frozen base weight
  auto y = torch::matmul(x, frozen);  // VICTIM(frozen_weight_update)
  frozen.mul_(0.99);  // CULPRIT(frozen_weight_update)
  y.pow(2).sum().backward();
}

// --- bug: pow's input modified ------------------------------------------------------------------
void PowInputModified() {
  auto x = torch::randn({5, 4});
  auto w = Param({4, 4});
  auto h = torch::matmul(x, w);
  auto cubic = h.pow(3);  // VICTIM(pow_input_modified)
  h.sub_(1.0);  // CULPRIT(pow_input_modified)
  (cubic.sum() + h.sum()).backward();
}

// --- bug: div_ on a saved input -----------------------------------------------------------------
// Attention scores scaled after the fact: bmm saved q, then q is divided in place.
void DivSavedInput() {
  auto x = torch::randn({2, 5, 8});
  auto w_q = Param({8, 8});
  auto k = Param({2, 5, 8});
  auto q = torch::matmul(x, w_q);
  auto scores = torch::bmm(q, k.transpose(1, 2));  // VICTIM(div_saved_input)
  q.div_(std::sqrt(8.0));  // CULPRIT(div_saved_input)
  (torch::softmax(scores, -1).sum() + q.sum()).backward();
}

// --- bug: an in-place op under NoGradGuard ------------------------------------------------------
// no_grad stops recording history, not version bumps.
void NoGradInplace() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto h = torch::matmul(x, w);
  auto act = torch::gelu(h);  // VICTIM(no_grad_inplace)
  {
    torch::NoGradGuard no_grad;
    h.clamp_(-3.0, 3.0);  // CULPRIT(no_grad_inplace)
  }
  act.sum().backward();
}

// --- bug: a C++ custom Function's saved input modified in place -------------------------------
// ctx->save_for_backward() keeps the input; the caller then adds to it in place. A C++
// Function's apply() is not an op: the victim is the first op its forward ran.
struct ScaledSquare : torch::autograd::Function<ScaledSquare> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * 0.5;  // VICTIM(cpp_custom_function_input)
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto x = ctx->get_saved_variables()[0];
    return {x * grads[0]};
  }
};

void CppCustomFunctionInput() {
  auto w = Param({4, 8});
  auto h = torch::tanh(w) * 2.0;
  auto energy = ScaledSquare::apply(h);
  h.add_(1.0);  // CULPRIT(cpp_custom_function_input)
  energy.sum().backward();
}

// --- legal: in-place on a tensor no node saved --------------------------------------------------
void LegalInplaceUnsaved() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto b = Param({8});
  auto h = torch::matmul(x, w) + b;  // add saves neither input nor output
  h.add_(1.0);
  h.sum().backward();
}

// --- legal: in-place before the save ------------------------------------------------------------
void LegalInplaceBeforeSave() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto gate = Param({8});
  auto h = torch::matmul(x, w);
  h.relu_();
  auto y = h * gate;  // saves h at its current version
  y.sum().backward();
}

// --- legal: an optimizer-style update under NoGradGuard after backward finished -----------------
void LegalNoGradUpdateAfterBackward() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto loss = torch::tanh(torch::matmul(x, w)).pow(2).mean();
  loss.backward();
  {
    torch::NoGradGuard no_grad;
    w.sub_(w.grad() * 0.1);
    w.grad().zero_();
  }
}

// --- legal: a fresh graph per step, parameters updated between steps ----------------------------
void LegalFreshGraphPerStep() {
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  auto x = torch::randn({16, 6});
  auto target = torch::randn({16, 1});
  for (int step = 0; step < 3; ++step) {
    auto loss = torch::mse_loss(model->forward(x), target);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// --- legal: a clone before the in-place op ------------------------------------------------------
void LegalCloneBeforeInplace() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto gate = torch::sigmoid(torch::matmul(x, w));
  auto masked = gate.clone();
  masked.masked_fill_(x < 0, 0.0);
  (gate.sum() + masked.sum()).backward();
}

// --- silent: a write through variable_data() (`.data`) into a saved tensor ----------------------
// variable_data() shares the storage but not the version counter: PyTorch cannot see the write
// and tanh's backward silently uses the halved output.
void SilentVariableDataWrite() {
  auto x = torch::randn({4, 8});
  auto w = Param({8, 8});
  auto a = torch::tanh(torch::matmul(x, w));  // VICTIM(silent_variable_data_write)
  a.variable_data().mul_(0.5);  // CULPRIT(silent_variable_data_write)
  a.sum().backward();
}

// --- silent: libtorch's SGD steps between forward and backward ----------------------------------
// The previous step's gradients are applied after this step's forward. Python's SGD would raise
// (it updates the parameter in place); libtorch's SGD::step() writes through p.data(), a tensor
// with its own version counter, so PyTorch raises nothing and the gradient uses the new weight.
void SilentSgdStepBeforeBackward() {
  torch::nn::Linear hidden(6, 8);
  torch::nn::Linear head(8, 1);
  std::vector<torch::Tensor> params = hidden->parameters();
  for (const auto& p : head->parameters()) params.push_back(p);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  auto x = torch::randn({16, 6});
  auto target = torch::randn({16, 1});
  for (int step = 0; step < 2; ++step) {
    auto prediction = head(torch::tanh(hidden(x)));  // VICTIM(silent_sgd_step_before_backward)
    auto loss = torch::mse_loss(prediction, target);
    opt.step();  // CULPRIT(silent_sgd_step_before_backward)
    opt.zero_grad();
    loss.backward();
  }
}

const std::vector<Case>& AllCases() {
  static const std::vector<Case> cases = {
      {"add_inplace_saved_input", Category::kBug, AddInplaceSavedInput},
      {"relu_after_tanh", Category::kBug, ReluAfterTanh},
      {"softmax_masked_fill", Category::kBug, SoftmaxMaskedFill},
      {"gan_discriminator_step", Category::kBug, GanDiscriminatorStep},
      {"rnn_clamp_state", Category::kBug, RnnClampState},
      {"inplace_in_nested_helper", Category::kBug, InplaceInNestedHelper},
      {"two_writes", Category::kBug, TwoWrites},
      {"sigmoid_mul", Category::kBug, SigmoidMul},
      {"exp_output_modified", Category::kBug, ExpOutputModified},
      {"view_write", Category::kBug, ViewWrite},
      {"index_put_slice", Category::kBug, IndexPutSlice},
      {"frozen_weight_update", Category::kBug, FrozenWeightUpdate},
      {"pow_input_modified", Category::kBug, PowInputModified},
      {"div_saved_input", Category::kBug, DivSavedInput},
      {"no_grad_inplace", Category::kBug, NoGradInplace},
      {"cpp_custom_function_input", Category::kBug, CppCustomFunctionInput},
      {"legal_inplace_unsaved", Category::kLegal, LegalInplaceUnsaved},
      {"legal_inplace_before_save", Category::kLegal, LegalInplaceBeforeSave},
      {"legal_no_grad_update_after_backward", Category::kLegal, LegalNoGradUpdateAfterBackward},
      {"legal_fresh_graph_per_step", Category::kLegal, LegalFreshGraphPerStep},
      {"legal_clone_before_inplace", Category::kLegal, LegalCloneBeforeInplace},
      {"silent_variable_data_write", Category::kSilent, SilentVariableDataWrite},
      {"silent_sgd_step_before_backward", Category::kSilent, SilentSgdStepBeforeBackward},
  };
  return cases;
}

const char* CategoryName(Category category) {
  switch (category) {
    case Category::kBug:
      return "bug";
    case Category::kLegal:
      return "legal";
    case Category::kSilent:
      return "silent";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: catalog_case NAME | --list\n";
    return 2;
  }
  const std::string_view arg = argv[1];
  if (arg == "--list") {
    for (const Case& c : AllCases()) {
      std::printf("%s %s\n", std::string(c.name).c_str(), CategoryName(c.category));
    }
    return 0;
  }
  for (const Case& c : AllCases()) {
    if (c.name != arg) continue;
    torch::manual_seed(0);
    try {
      c.run();
    } catch (const c10::Error& e) {
      std::cerr << "error: " << e.what_without_backtrace() << "\n";
      return 1;
    }
    return 0;
  }
  std::cerr << "error: unknown case '" << arg << "' (see --list)\n";
  return 2;
}
