// The options `torchrr record` hands to the recorder through TORCHRR_* variables
// (recorder/src/options/environment_options.h): each one's default when unset, each value read, and what
// happens to a value not understood. No torch.
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "options/environment_options.h"

namespace torchrr::recorder {
namespace {

using Variables = std::map<std::string, std::string>;

std::optional<RecorderOptions> Read(const Variables& variables, bool runs_python = false) {
  return OptionsFromEnvironment(
      [&variables](const char* name) -> const char* {
        auto it = variables.find(name);
        return it == variables.end() ? nullptr : it->second.c_str();
      },
      runs_python);
}

TEST(EnvironmentOptions, NoOutputNoRecording) {
  EXPECT_FALSE(Read({}));
  EXPECT_FALSE(Read({{"TORCHRR_OUTPUT", ""}, {"TORCHRR_ALL_OPS", "1"}}));
}

TEST(EnvironmentOptions, UnsetVariablesTakeRecorderOptionsDefaults) {
  const RecorderOptions defaults;
  std::optional<RecorderOptions> options = Read({{"TORCHRR_OUTPUT", "/t/run.trr"}});
  ASSERT_TRUE(options);
  EXPECT_EQ(options->path, "/t/run.trr");
  EXPECT_EQ(options->native_stacks, defaults.native_stacks);
  EXPECT_TRUE(options->native_stacks);
  EXPECT_EQ(options->python_stacks, defaults.python_stacks);
  EXPECT_EQ(options->max_buffered_bytes, defaults.max_buffered_bytes);
  EXPECT_EQ(options->when_full, defaults.when_full);
  EXPECT_EQ(options->rank, defaults.rank);
  EXPECT_EQ(options->verify_saved, defaults.verify_saved);
  EXPECT_EQ(options->cuda_kernels, defaults.cuda_kernels);
  EXPECT_EQ(options->all_ops, defaults.all_ops);
  EXPECT_EQ(options->follow_forks, defaults.follow_forks);
  EXPECT_FALSE(options->follow_forks);
}

TEST(EnvironmentOptions, NativeStacksOffByDefaultInAPythonProcess) {
  std::optional<RecorderOptions> python = Read({{"TORCHRR_OUTPUT", "run.trr"}}, true);
  ASSERT_TRUE(python);
  EXPECT_FALSE(python->native_stacks);
  EXPECT_TRUE(python->python_stacks);
  python = Read({{"TORCHRR_OUTPUT", "run.trr"}, {"TORCHRR_NATIVE_STACKS", "1"}}, true);
  EXPECT_TRUE(python->native_stacks);
}

TEST(EnvironmentOptions, EveryVariableIsRead) {
  std::optional<RecorderOptions> options = Read({{"TORCHRR_OUTPUT", "run.trr"},
                                                 {"TORCHRR_NATIVE_STACKS", "0"},
                                                 {"TORCHRR_PYTHON_STACKS", "off"},
                                                 {"TORCHRR_MAX_BUFFERED_BYTES", "1048576"},
                                                 {"TORCHRR_WHEN_FULL", "drop"},
                                                 {"TORCHRR_VERIFY_SAVED", "1"},
                                                 {"TORCHRR_CUDA_KERNELS", "false"},
                                                 {"TORCHRR_ALL_OPS", "yes"},
                                                 {"TORCHRR_FOLLOW_FORKS", "on"},
                                                 {"TORCHRR_SOURCE", "0"},
                                                 {"TORCHRR_KEEP_LAST", "3"},
                                                 {"TORCHRR_KEEP_LAST_BYTES", "4096"},
                                                 {"TORCHRR_SPILL", "/tmp/spill"}});
  ASSERT_TRUE(options);
  EXPECT_FALSE(options->native_stacks);
  EXPECT_FALSE(options->python_stacks);
  EXPECT_EQ(options->max_buffered_bytes, 1048576u);
  EXPECT_EQ(options->when_full, WhenFull::kDrop);
  EXPECT_TRUE(options->verify_saved);
  EXPECT_FALSE(options->cuda_kernels);
  EXPECT_TRUE(options->all_ops);
  EXPECT_TRUE(options->follow_forks);
  EXPECT_FALSE(options->source);
  EXPECT_EQ(options->keep_last, 3u);
  EXPECT_EQ(options->keep_last_bytes, 4096u);
  EXPECT_EQ(options->spill, "/tmp/spill");
}

TEST(EnvironmentOptions, ValuesNotUnderstoodWarnAndKeepTheDefault) {
  const RecorderOptions defaults;
  testing::internal::CaptureStderr();
  std::optional<RecorderOptions> options = Read({{"TORCHRR_OUTPUT", "run.trr"},
                                                 {"TORCHRR_VERIFY_SAVED", "maybe"},
                                                 {"TORCHRR_MAX_BUFFERED_BYTES", "12MB"},
                                                 {"TORCHRR_WHEN_FULL", "never"}});
  std::string warnings = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(options);
  EXPECT_FALSE(options->verify_saved);
  EXPECT_EQ(options->max_buffered_bytes, defaults.max_buffered_bytes);
  EXPECT_EQ(options->when_full, WhenFull::kWait);
  EXPECT_NE(warnings.find("TORCHRR_VERIFY_SAVED=maybe ignored"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("TORCHRR_MAX_BUFFERED_BYTES=12MB ignored"), std::string::npos);
  EXPECT_NE(warnings.find("TORCHRR_WHEN_FULL=never ignored"), std::string::npos);

  testing::internal::CaptureStderr();
  options = Read({{"TORCHRR_OUTPUT", "run.trr"}, {"TORCHRR_MAX_BUFFERED_BYTES", "0"}});
  warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(options->max_buffered_bytes, defaults.max_buffered_bytes);  // Not a buffer of 0.
  EXPECT_NE(warnings.find("TORCHRR_MAX_BUFFERED_BYTES=0 ignored"), std::string::npos);
}

TEST(EnvironmentOptions, AnOptionWithoutWhatItNeedsOrWithWhatItExcludesIsDropped) {
  testing::internal::CaptureStderr();
  std::optional<RecorderOptions> options =
      Read({{"TORCHRR_OUTPUT", "run.trr"}, {"TORCHRR_SPILL", "/tmp/spill"}});
  std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(options->spill, "");
  EXPECT_NE(warnings.find("TORCHRR_SPILL ignored (it needs TORCHRR_KEEP_LAST)"), std::string::npos)
      << warnings;
  testing::internal::CaptureStderr();
  options = Read({{"TORCHRR_OUTPUT", "run.trr"}, {"TORCHRR_STEPS", "2:5"},
                  {"TORCHRR_KEEP_LAST", "3"}, {"TORCHRR_SPILL", "/tmp/spill"}});
  warnings = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(options->steps.on());
  EXPECT_EQ(options->keep_last, 3u);
  EXPECT_EQ(options->spill, "/tmp/spill");
  EXPECT_NE(warnings.find("TORCHRR_STEPS ignored (it excludes TORCHRR_KEEP_LAST)"),
            std::string::npos)
      << warnings;
}

TEST(EnvironmentOptions, EachRankWritesItsOwnTrace) {
  std::optional<RecorderOptions> options =
      Read({{"TORCHRR_OUTPUT", "/t/run.trr"}, {"RANK", "3"}});
  ASSERT_TRUE(options);
  EXPECT_EQ(options->path, "/t/run.rank3.trr");
  EXPECT_EQ(options->rank, 3);
  EXPECT_EQ(Read({{"TORCHRR_OUTPUT", "/t.d/run"}, {"RANK", "0"}})->path, "/t.d/run.rank0.trr");
  EXPECT_EQ(Read({{"TORCHRR_OUTPUT", "/t/run.bin"}, {"RANK", "1"}})->path, "/t/run.rank1.bin");
  // Not a rank: one trace, as without RANK; the header's rank is left to the recorder.
  options = Read({{"TORCHRR_OUTPUT", "/t/run.trr"}, {"RANK", "x"}});
  EXPECT_EQ(options->path, "/t/run.trr");
  EXPECT_EQ(options->rank, -1);
}

}  // namespace
}  // namespace torchrr::recorder
