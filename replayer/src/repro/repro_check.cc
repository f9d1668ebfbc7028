// JudgeRepro: whether a reproducer's run showed the recorded violation.
#include <string>
#include <string_view>

#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/repro.h"

namespace torchrr::replayer {
namespace {

// What the script's silent-write branch prints when the gradients differ (ScriptMain).
constexpr std::string_view kGradientsDiffer = "the gradients differ";

// `text` with the tensor type of PyTorch's version message ("inplace operation: [TYPE [4, 3]]")
// read as "T": a CUDA trace's script run on the CPU names torch.FloatTensor where the recorded
// message named torch.cuda.FloatTensor, and a trace recorded from C++ names CPUFloatType.
std::string WithoutTensorType(std::string_view text) {
  constexpr std::string_view kBefore = "inplace operation: [";
  std::string out(text);
  const size_t at = out.find(kBefore);
  if (at == std::string::npos) return out;
  const size_t type = at + kBefore.size();
  const size_t end = out.find(' ', type);
  if (end != std::string::npos) out.replace(type, end - type, "T");
  return out;
}

// PyTorch's words for the kind: how its message starts.
std::string_view KindWords(ViolationKind kind) {
  switch (kind) {
    case ViolationKind::kDetached:
      return "Trying to use a saved tensor that has been detached in-place";
    case ViolationKind::kFreed: return "Trying to backward through the graph a second time";
    default:
      return "one of the variables needed for gradient computation has been modified by an "
             "inplace operation";
  }
}

// What the script must print: the first sentence of PyTorch's recorded message (up to its first
// ". ", before the hint whose wording changes across releases), from where PyTorch's words start
// (a compiler that raised it wraps it: "backend='inductor' raised:\nRuntimeError: ..."), or
// PyTorch's words for the kind.
std::string ExpectedMessage(const Violation& v) {
  const std::string_view words = KindWords(v.kind);
  if (v.pytorch_message && !v.pytorch_message->empty()) {
    std::string_view message = *v.pytorch_message;
    if (size_t at = message.find(words); at != std::string_view::npos) message.remove_prefix(at);
    return WithoutTensorType(message.substr(0, message.find(". ")));
  }
  return std::string(words);
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
    check.reproduced =
        exit_status == 1 && WithoutTensorType(output).find(expected) != std::string::npos;
    if (check.reproduced) {
      const std::string last = LastLine(output);
      check.summary = "the script raised PyTorch's error: " + Printable(last.substr(0, last.find(". ")));
    }
  }
  if (!check.reproduced) {
    const std::string last = LastLine(output);
    check.summary = "the script exited with status " + std::to_string(exit_status) +
                    (last.empty() ? "" : ": " + Printable(last));
  }
  return check;
}

}  // namespace torchrr::replayer
