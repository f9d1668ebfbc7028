// JudgeRepro: whether a reproducer's run showed the recorded violation.
#include <string>
#include <string_view>

#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/repro.h"

namespace torchrr::replayer {
namespace {

// What the script's silent-write branch prints when the gradients differ (ScriptMain).
constexpr std::string_view kGradientsDiffer = "the gradients differ";

// `text` with "torch.cuda." read as "torch.": a CUDA trace's script run on the CPU names
// torch.FloatTensor where the recorded message named torch.cuda.FloatTensor.
std::string WithoutCuda(std::string_view text) {
  std::string out(text);
  for (size_t at = out.find("torch.cuda."); at != std::string::npos;
       at = out.find("torch.cuda.", at)) {
    out.erase(at + 6, 5);
  }
  return out;
}

// What the script must print: the first sentence of PyTorch's recorded message (up to its first
// ". ", before the hint whose wording changes across releases), or PyTorch's words for the kind.
std::string ExpectedMessage(const Violation& v) {
  if (v.pytorch_message && !v.pytorch_message->empty()) {
    const std::string& message = *v.pytorch_message;
    return WithoutCuda(message.substr(0, message.find(". ")));
  }
  switch (v.kind) {
    case ViolationKind::kDetached:
      return "Trying to use a saved tensor that has been detached in-place";
    case ViolationKind::kFreed: return "Trying to backward through the graph a second time";
    default:
      return "one of the variables needed for gradient computation has been modified by an "
             "inplace operation";
  }
}

// The output's last line that is not blank: the error the script ended with, or its verdict.
std::string LastLine(std::string_view output) {
  size_t end = output.find_last_not_of(" \t\r\n");
  if (end == std::string_view::npos) return "";
  size_t start = output.rfind('\n', end);
  start = start == std::string_view::npos ? 0 : start + 1;
  return std::string(output.substr(start, end + 1 - start));
}

}  // namespace

ReproCheck JudgeRepro(const Violation& v, int exit_status, std::string_view output) {
  ReproCheck check;
  if (v.kind == ViolationKind::kSilent) {
    check.reproduced = exit_status == 1 && output.find(kGradientsDiffer) != std::string_view::npos;
    check.summary = check.reproduced ? "the gradients differ with the recorded write and with "
                                       "the write made on a copy, and PyTorch said nothing"
                                     : "";
  } else {
    const std::string expected = ExpectedMessage(v);
    check.reproduced = exit_status == 1 && WithoutCuda(output).find(expected) != std::string::npos;
    if (check.reproduced) check.summary = "the script raised PyTorch's error: " + expected;
  }
  if (!check.reproduced) {
    const std::string last = LastLine(output);
    check.summary = "the script exited with status " + std::to_string(exit_status) +
                    (last.empty() ? "" : ": " + Printable(last));
  }
  return check;
}

}  // namespace torchrr::replayer
