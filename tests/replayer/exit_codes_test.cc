// The command line's exit code for each way a trace read can end (replayer/cli/exit_codes.h).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

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
  EXPECT_EQ(ReplayExitCode(0, false, false, false), 0);
  EXPECT_EQ(ReplayExitCode(0, false, true, false), kExitViolations);
  EXPECT_EQ(ReplayExitCode(0, true, false, false), kExitIncomplete);
  EXPECT_EQ(ReplayExitCode(0, true, true, false), kExitIncomplete);
  EXPECT_EQ(ReplayExitCode(4, false, true, false), 4);
  EXPECT_EQ(ReplayExitCode(5, true, true, false), 5);
  // A trace with no op is never a clean verdict; the program's error it kept is said, but the
  // trace still holds no verdict on it.
  EXPECT_EQ(ReplayExitCode(0, false, false, true), kExitEmpty);
  EXPECT_EQ(ReplayExitCode(0, false, true, true), kExitEmpty);
  EXPECT_EQ(ReplayExitCode(0, true, false, true), kExitIncomplete);
  EXPECT_EQ(ReplayExitCode(4, false, false, true), 4);
}

// The README's table, as kExitCodeMeanings gives it.
std::string ReadmeTable() {
  std::string table = "| Code | Meaning |\n|---|---|\n";
  for (const ExitCodeMeaning& exit : kExitCodeMeanings) {
    table += "| " + std::to_string(exit.code) + " | " + exit.meaning + " |\n";
  }
  return table;
}

TEST(ExitCodes, TheReadmeTableIsTheTable) {
  std::ifstream file(std::string(TORCHRR_SOURCE_DIR) + "/README.md");
  std::stringstream text;
  text << file.rdbuf();
  const std::string readme = text.str();
  const std::string begin = "<!-- exit codes: begin -->\n", end = "<!-- exit codes: end -->";
  const size_t from = readme.find(begin), to = readme.find(end);
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(readme.substr(from + begin.size(), to - from - begin.size()), ReadmeTable())
      << "README.md's table, as exit_codes.h gives it:\n" << ReadmeTable();
}

TEST(ExitCodes, EachCodeIsListedOnce) {
  std::set<int> codes;
  for (const ExitCodeMeaning& exit : kExitCodeMeanings) {
    EXPECT_TRUE(codes.insert(exit.code).second) << exit.code;
  }
  EXPECT_NE(ExitCodesText().find("  127 record: the program could not be run\n"),
            std::string::npos);
}

}  // namespace
}  // namespace torchrr::cli
