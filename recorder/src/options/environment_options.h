// Recording an unchanged program: `torchrr record` hands its command line's options to the
// recorder through TORCHRR_* environment variables, read when the program starts recording
// (preload.cc in a C++ program, the sitecustomize in a Python one, both through
// torchrr_start_from_environment). This is the one place they are parsed and where each one that
// is unset takes its default:
//
//   TORCHRR_OUTPUT  the trace; unset or empty: no recording. With RANK=N set (each torchrun
//                   worker), FILE.rankN.EXT instead (EXT: FILE's, or .trr), and rank N.
//   the options     one variable each, named and encoded as recording_options.def says
//                   (TORCHRR_KEEP_LAST=3, TORCHRR_STEPS=2:5, TORCHRR_WHEN_FULL=drop). C++ stacks
//                   are off by default in a process that runs a Python interpreter.
//
// A value not understood prints one warning and leaves the option at its default; so does an
// option given without one it needs, or with one it excludes (the second of the two is dropped).
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

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_ENVIRONMENT_OPTIONS_H_
