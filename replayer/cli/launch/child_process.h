// Running the program `torchrr record` records: fork, exec and wait, with the signals forwarded.
//
// Signals, as a shell's `system()` treats them: the program runs in this process group, so the
// terminal's SIGINT and SIGQUIT (Ctrl-C, Ctrl-\) reach it directly; this process ignores them
// while it waits, and never sends a second one. SIGTERM and SIGHUP sent to this process by
// another (`kill PID`, a job scheduler) are forwarded to the program once; a SIGHUP from the
// kernel (the terminal hung up) went to the program already.
#ifndef TORCHRR_REPLAYER_CLI_LAUNCH_CHILD_PROCESS_H_
#define TORCHRR_REPLAYER_CLI_LAUNCH_CHILD_PROCESS_H_

#include <functional>
#include <string>
#include <vector>

namespace torchrr::cli {

// Runs `command` (argv[0] looked up on PATH), calling `prepare` in the child before the exec
// (where it sets the child's environment), and waits for it. Returns its exit status, 128+N when
// signal N ended it, kExitNotRun when it could not be run, kExitOther when it could not be
// started or waited for (each said in one line).
int RunProgram(const std::vector<std::string>& command, const std::function<void()>& prepare);

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_LAUNCH_CHILD_PROCESS_H_
