// A standalone reproducer for one violation: a Python script, using only torch, that rebuilds the
// saved tensor from seeded random leaves, runs the op that saved it and the op that wrote it, and
// then the backward that needs it.
//
// A maintainer who receives a trace cannot run the reporter's program (its model, data and code
// are not there); what they ask for first is a minimal reproducer. The trace holds every op with
// the tensors it read and wrote, their shapes, dtypes, strides and storages, and its non-tensor
// arguments, which is enough to rebuild the slice of the recorded graph that matters: the ops
// that produced the saved tensor (and the culprit's operands) from leaves, the victim, the
// culprit, and a use of the victim's output. Each op is called through its ATen overload
// (torch.ops.aten.<name>.<overload>), commented with the user's file:line. Views are rebuilt by
// their recorded view ops, so aliasing and the shared version counter are as they were.
//
// A raising violation's script raises PyTorch's error; a silent one's computes the gradient with
// the recorded write and with the write made on a copy, prints whether they differ and exits 1
// when they do. What the slice cannot express (a Python autograd.Function, a compiled region, an
// op outside aten, an argument the trace could not keep) is refused with the reason: never a
// script that silently does not reproduce.
//
// Torch-free: it reads records and the analysis' Report.
#ifndef TORCHRR_REPLAYER_REPRO_H_
#define TORCHRR_REPLAYER_REPRO_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "torchrr/format/records.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// How every script WriteRepro writes begins: `torchrr repro -o` replaces an existing file only
// when it starts so (or with --force).
inline constexpr std::string_view kReproPrefix = "# torchrr repro: ";

struct ReproOptions {
  size_t violation = 0;      // Index into Report::violations.
  // The device the script runs the recorded non-CPU tensors on ("cpu", "cuda:1"); empty: the
  // recorded one when the running machine has it, else the CPU.
  std::string device;
  std::string trace_name;    // How the script names the trace it came from.
};

struct Repro {
  bool ok = false;
  std::string error;         // When !ok: why no script, one line ("... cannot express ...").
  std::string script;        // The Python script.
  size_t slice_ops = 0;      // The recorded ops the script calls.
  size_t stand_ins = 0;      // Of those, the ones called through a stand-in Function.
  uint64_t trace_ops = 0;    // The ops the trace holds (OpRecords of every scope).
};

// The reproducer of `report.violations[options.violation]`, from `records` (every record of the
// trace the report was made from, in file order) and `info` (its FileInfo). Returns !ok with the
// reason when the violation index is out of range, the violation's kind has no reproducer yet
// ("version", "detached", "freed", and "silent" writes through another tensor or into a save
// whose hooks packed the tensor itself, have), or the slice holds what it cannot express.
// Thread-compatible; reads only its arguments.
Repro WriteRepro(const std::vector<format::Record>& records, const Report& report,
                 const format::FileInfo& info, const ReproOptions& options);

// What a run of a reproducer showed (`torchrr repro --check`).
struct ReproCheck {
  bool reproduced = false;
  // One line: "the script raised PyTorch's error: one of the variables ... instead", "the
  // gradients differ ...", or why it did not reproduce ("backward did not raise", another error).
  std::string summary;
};

// Judges a run of the script WriteRepro wrote for `v`, from its exit status (1: it raised, or a
// silent write's gradients differed; 2: not reproduced) and `output`, its stdout and stderr
// together. A raising violation reproduced when the script exited 1 and its output holds the
// first sentence of PyTorch's recorded message (its shape, node and versions; the tensor's type
// name aside, which differs on another device and in a trace recorded from C++), or PyTorch's
// words for the kind when the trace kept no message; a silent one when it exited 1 saying the gradients differ.
// Thread-compatible.
ReproCheck JudgeRepro(const Violation& v, int exit_status, std::string_view output);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_REPRO_H_
