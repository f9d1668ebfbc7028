// A libtorch program that ends in a chosen way, for `torchrr record`: the trace must be closed
// cleanly whatever the way (atexit skipped by _exit, the image replaced by an exec), and the
// exit status passed through.
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <unistd.h>

#include <torch/torch.h>

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "return";
  auto x = torch::randn({8}, torch::requires_grad());
  auto y = (x * 2).sigmoid();
  if (std::strcmp(mode, "exit") == 0) std::exit(3);
  // Skip atexit: the recorder must close the trace all the same.
  if (std::strcmp(mode, "_exit") == 0) _exit(5);
  if (std::strcmp(mode, "_Exit") == 0) std::_Exit(6);
  if (std::strcmp(mode, "execv") == 0) {  // Re-exec, as launchers do: the new image returns.
    char again[] = "return";
    char* args[] = {argv[0], again, nullptr};
    execv("/proc/self/exe", args);
    return 126;
  }
  if (std::strcmp(mode, "throw") == 0) throw std::runtime_error("planted uncaught exception");
  if (std::strcmp(mode, "backward") == 0) {
    y.mul_(2);
    y.sum().backward();  // Raises the in-place error, uncaught.
  }
  y.sum().backward();
  return 0;
}
