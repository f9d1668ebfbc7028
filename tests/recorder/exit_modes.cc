// A libtorch program that ends in a chosen way, for `torchrr record`: the trace must be closed
// cleanly whatever the way, and the exit status passed through.
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <torch/torch.h>

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "return";
  auto x = torch::randn({8}, torch::requires_grad());
  auto y = (x * 2).sigmoid();
  if (std::strcmp(mode, "exit") == 0) std::exit(3);
  if (std::strcmp(mode, "throw") == 0) throw std::runtime_error("planted uncaught exception");
  if (std::strcmp(mode, "backward") == 0) {
    y.mul_(2);
    y.sum().backward();  // Raises the in-place error, uncaught.
  }
  y.sum().backward();
  return 0;
}
