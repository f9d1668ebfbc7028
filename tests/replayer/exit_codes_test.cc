// The command line's exit code for each way a trace read can end (replayer/cli/exit_codes.h).
#include <gtest/gtest.h>

#include "exit_codes.h"

namespace torchrr::cli {
namespace {

using format::StatusCode;

TEST(ExitCodes, EveryReadStatus) {
  EXPECT_EQ(ExitCodeFor(StatusCode::kOk), 0);
  EXPECT_EQ(ExitCodeFor(StatusCode::kNotATrace), 3);
  EXPECT_EQ(ExitCodeFor(StatusCode::kTruncated), 4);
  EXPECT_EQ(ExitCodeFor(StatusCode::kCorrupt), 5);
  EXPECT_EQ(ExitCodeFor(StatusCode::kTooNew), 6);
  EXPECT_EQ(ExitCodeFor(StatusCode::kIoError), 7);
  EXPECT_EQ(ExitCodeFor(StatusCode::kInvalidArgument), 7);
}

TEST(ExitCodes, ReplayReportsTheLeastCleanOfWhatItFound) {
  EXPECT_EQ(ReplayExitCode(0, false, false), 0);
  EXPECT_EQ(ReplayExitCode(0, false, true), kExitViolations);
  EXPECT_EQ(ReplayExitCode(0, true, false), kExitIncomplete);
  EXPECT_EQ(ReplayExitCode(0, true, true), kExitIncomplete);
  EXPECT_EQ(ReplayExitCode(4, false, true), 4);
  EXPECT_EQ(ReplayExitCode(5, true, true), 5);
}

}  // namespace
}  // namespace torchrr::cli
