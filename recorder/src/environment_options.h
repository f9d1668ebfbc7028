// Recording an unchanged program: `torchrr record` hands its command line's options to the
// recorder through TORCHRR_* environment variables, read when the program starts recording
// (preload.cc in a C++ program, the sitecustomize in a Python one, both through
// torchrr_start_from_environment). This is the one place they are parsed and where each one that
// is unset takes its default:
//
//   TORCHRR_OUTPUT              the trace; unset or empty: no recording. With RANK=N set (each
//                               torchrun worker), FILE.rankN.EXT instead (EXT: FILE's, or .trr).
//   TORCHRR_NATIVE_STACKS       C++ stacks. Default: on, except in a process that runs a Python
//                               interpreter: its user lines are in its Python frames, its C++
//                               frames are the interpreter's and torch's, and unwinding them
//                               costs more than the op.
//   TORCHRR_PYTHON_STACKS       Python stacks. Default: on.
//   TORCHRR_MAX_BUFFERED_BYTES  bytes waiting for the writer thread. Default: RecorderOptions'.
//   TORCHRR_WHEN_FULL           `wait` (the default) or `drop`.
//   TORCHRR_VERIFY_SAVED        RecorderOptions::verify_saved. Default: off.
//   TORCHRR_CUDA_KERNELS        RecorderOptions::cuda_kernels. Default: on.
//   TORCHRR_ALL_OPS             RecorderOptions::all_ops. Default: off.
//   TORCHRR_FOLLOW_FORKS        RecorderOptions::follow_forks: a forked child records into
//                               FILE.pidN.EXT. Default: off.
//   TORCHRR_SOURCE              RecorderOptions::source: user code's lines in the trace.
//                               Default: on.
//   TORCHRR_KEEP_LAST           RecorderOptions::keep_last_steps. Default: 0 (every step).
//   TORCHRR_KEEP_LAST_BYTES     RecorderOptions::keep_last_bytes. Default: RecorderOptions'.
//   TORCHRR_SPILL               RecorderOptions::spill_dir. Default: none (in memory only).
//   TORCHRR_STEPS               RecorderOptions::steps_first and steps_last: "A:B", "A:" or
//                               ":B". Default: every step.
//   TORCHRR_FAIL_AT_OP          RecorderOptions::fail_at_op, for tests. Default: 0 (never).
//
// A switch reads 1/true/yes/on or 0/false/no/off. A value not understood prints one warning and
// leaves the option at its default.
#ifndef TORCHRR_RECORDER_ENVIRONMENT_OPTIONS_H_
#define TORCHRR_RECORDER_ENVIRONMENT_OPTIONS_H_

#include <functional>
#include <optional>

#include "torchrr/recorder.h"

namespace torchrr::recorder {

// The value of the environment variable `name`, or nullptr when it is unset.
using EnvironmentLookup = std::function<const char*(const char* name)>;

// The options the variables above give, or nullopt when TORCHRR_OUTPUT is unset or empty.
// `runs_python`: the calling process runs a Python interpreter (native stacks' default).
// Thread-safe when `lookup` is.
std::optional<RecorderOptions> OptionsFromEnvironment(const EnvironmentLookup& lookup,
                                                      bool runs_python);

// The same for this process: std::getenv, and whether a Python interpreter is initialized in it
// now (a preloaded library's constructor runs before the interpreter starts). Not thread-safe
// against setenv, as std::getenv.
std::optional<RecorderOptions> OptionsFromEnvironment();

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_ENVIRONMENT_OPTIONS_H_
