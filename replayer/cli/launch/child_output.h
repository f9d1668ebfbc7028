// Asking another program a question before `torchrr record` runs the user's: its standard output.
#ifndef TORCHRR_REPLAYER_CLI_LAUNCH_CHILD_OUTPUT_H_
#define TORCHRR_REPLAYER_CLI_LAUNCH_CHILD_OUTPUT_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchrr::cli {

// Runs `argv` (argv[0] looked up on PATH unless it holds a '/') with `set` set and `unset`
// cleared in its environment, stdin and stderr on /dev/null, and returns what it wrote to stdout
// when it exited with status 0; nullopt when it could not be run or exited otherwise. Waits for it.
std::optional<std::string> ChildOutput(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& set = {},
    const std::vector<std::string>& unset = {});

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_LAUNCH_CHILD_OUTPUT_H_
