// The text report quotes the culprit's and the victim's lines from the files a trace names, on the
// machine that replays it. A trace from a stranger can name any path: only regular source files
// are read, never a special or kernel file (replayer/src/source_files.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "torchrr/format/source_files.h"
#include "torchrr/replayer/replayer.h"
#include "trace_builder.h"

namespace torchrr::replayer {
namespace {

using testing::kOutput;
using testing::TraceBuilder;

// The report of a violation whose culprit (line 1) and victim (line 2) are in `path`, made on
// another thread: nullopt when it takes over 10 s (it blocked on the file).
std::optional<std::string> ReportNaming(const std::string& path) {
  auto report = std::async(std::launch::async, [path] {
    TraceBuilder b;
    auto x = b.Leaf({4});
    auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}},
                       b.At(2, path));
    b.Inplace("aten::mul_", y.out, {}, b.At(1, path), false);
    b.Backward({y.node}, y.node);
    return FormatText(Analyze(b.records), /*color=*/false);
  });
  if (report.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return report.get();
  // Unblock a reader waiting for a FIFO's writer, so that the thread can end.
  int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd >= 0) ::close(fd);
  report.wait();
  return std::nullopt;
}

// The same with the trace carrying `lines` of `path` (format 1.4) from line 1, with `hash`.
std::string ReportCarrying(const std::string& path, const std::vector<std::string>& lines,
                           uint64_t hash) {
  TraceBuilder b;
  auto x = b.Leaf({4});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}},
                     b.At(2, path));
  b.records.push_back(format::SourceFile{b.Str(path), hash, 64, 3});
  b.records.push_back(format::SourceLines{b.Str(path), 1, lines});
  b.Inplace("aten::mul_", y.out, {}, b.At(1, path), false);
  b.Backward({y.node}, y.node);
  return FormatText(Analyze(b.records), /*color=*/false);
}

// Local source roots for one test (SetLocalSourceRoots), the working directory again after it.
struct SourceRoots {
  explicit SourceRoots(std::vector<std::string> roots) { SetLocalSourceRoots(std::move(roots)); }
  ~SourceRoots() { SetLocalSourceRoots({}); }
};

// A path in the test's temporary directory, removed first.
std::string TempPath(const std::string& name) {
  std::string path = ::testing::TempDir() + "/torchrr_source_quote_" + name;
  std::remove(path.c_str());
  return path;
}

TEST(SourceQuoteTest, ARegularFileIsQuoted) {
  SourceRoots roots({::testing::TempDir()});
  std::string path = TempPath("train.py");
  std::ofstream(path) << "    y.mul_(2)\r\n    y = torch.sigmoid(x)\n";
  std::optional<std::string> text = ReportNaming(path);
  ASSERT_TRUE(text);
  EXPECT_NE(text->find("1 |     y.mul_(2)\n"), std::string::npos) << *text;  // CR dropped.
  EXPECT_NE(text->find("2 |     y = torch.sigmoid(x)\n"), std::string::npos) << *text;
  std::remove(path.c_str());
}

TEST(SourceQuoteTest, SpecialAndKernelFilesAreNeverRead) {
  SourceRoots roots({"/"});  // What the reader itself refuses, wherever the roots are.
  std::string fifo = TempPath("fifo.py");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string environ_link = TempPath("environ.py");
  ASSERT_EQ(::symlink("/proc/self/environ", environ_link.c_str()), 0);
  std::string large = TempPath("large.py");  // A sparse file one byte over 8 MiB, line 1 "x".
  {
    std::ofstream(large) << "x\n";
    ASSERT_EQ(::truncate(large.c_str(), (8 << 20) + 1), 0);
  }
  for (const std::string& path : {std::string("/proc/self/environ"), environ_link,
                                  std::string("/proc/self/cmdline"), std::string("/dev/zero"),
                                  std::string("/dev/urandom"), std::string("/dev/stdin"), fifo,
                                  large}) {
    SCOPED_TRACE(path);
    std::optional<std::string> text = ReportNaming(path);
    ASSERT_TRUE(text) << "blocked reading " << path;
    EXPECT_EQ(text->find(" |     "), std::string::npos) << "a line was quoted:\n" << *text;
    EXPECT_NE(text->find("= culprit: aten::mul_ changed the version 0 -> 1"), std::string::npos)
        << *text;
    EXPECT_EQ(text->find("PATH="), std::string::npos);
  }
  std::remove(fifo.c_str());
  std::remove(environ_link.c_str());
  std::remove(large.c_str());
}

// A stranger's trace that names a file of this machine and carries none of its code: the file is
// read only when it is a source file under the roots (the working directory by default).
TEST(SourceQuoteTest, OnlySourceFilesUnderTheRootsAreRead) {
  const std::string dir = TempPath("roots");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string secret = dir + "/credentials";
  std::ofstream(secret) << "aws_secret_access_key = SECRET1\nline two SECRET2\n";
  const std::string script = dir + "/train.py";
  std::ofstream(script) << "    y.mul_(2)\n    y = torch.sigmoid(x)\n";
  const std::string kNotQuoted = "is not quoted: the trace carries none of its code";
  {
    SourceRoots roots({dir});
    std::optional<std::string> text = ReportNaming(secret);  // Under the root, no source file.
    ASSERT_TRUE(text);
    EXPECT_EQ(text->find("SECRET"), std::string::npos) << *text;
    size_t said = text->find(kNotQuoted);
    EXPECT_NE(said, std::string::npos) << *text;
    EXPECT_EQ(text->find(kNotQuoted, said + 1), std::string::npos) << "said twice:\n" << *text;
    text = ReportNaming(script);
    ASSERT_TRUE(text);
    EXPECT_NE(text->find("1 |     y.mul_(2)\n"), std::string::npos) << *text;
  }
  {
    SourceRoots roots({dir + "/elsewhere", "/nonexistent"});  // A source file outside the roots.
    ASSERT_EQ(::mkdir((dir + "/elsewhere").c_str(), 0700), 0);
    std::optional<std::string> text = ReportNaming(script);
    ASSERT_TRUE(text);
    EXPECT_EQ(text->find("y.mul_(2)\n"), std::string::npos) << *text;
    EXPECT_NE(text->find(kNotQuoted), std::string::npos) << *text;
    // A root that is a prefix of the name only (dir/elsewhere vs dir/elsewhere2) is not above it.
    ASSERT_EQ(::mkdir((dir + "/elsewhere2").c_str(), 0700), 0);
    std::ofstream(dir + "/elsewhere2/train.py") << "    y.mul_(2)\n";
    text = ReportNaming(dir + "/elsewhere2/train.py");
    ASSERT_TRUE(text);
    EXPECT_EQ(text->find("y.mul_(2)\n"), std::string::npos) << *text;
    // The trace's own code is quoted wherever the file is.
    std::string carried = ReportCarrying(secret, {"    y.mul_(2)"}, 1);
    EXPECT_NE(carried.find("1 |     y.mul_(2)\n"), std::string::npos) << carried;
    EXPECT_EQ(carried.find("SECRET"), std::string::npos) << carried;
  }
  std::filesystem::remove_all(dir);
}

TEST(SourceQuoteTest, TheTracesCodeIsQuotedWhereTheFileIsGone) {
  std::string path = TempPath("gone.py");
  std::string text = ReportCarrying(path, {"    y.mul_(2)", "    y = torch.sigmoid(x)"}, 1);
  EXPECT_NE(text.find("1 |     y.mul_(2)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("2 |     y = torch.sigmoid(x)\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("differs"), std::string::npos) << text;
}

// The underline covers the statement, not a trailing comment; a comment sign inside a string is
// no comment; a line without a comment is underlined whole.
TEST(SourceQuoteTest, TheUnderlineStopsBeforeATrailingComment) {
  std::string path = TempPath("commented.py");
  std::string text = ReportCarrying(
      path, {"    y.mul_(2)   # the bug", "    y = torch.sigmoid(x, name='#1')  # saved"}, 1);
  EXPECT_NE(text.find("1 |     y.mul_(2)   # the bug\n"), std::string::npos) << text;
  EXPECT_NE(text.find("|     ^^^^^^^^^ aten::mul_"), std::string::npos) << text;
  // The victim's: the call with its '#1' argument, 31 characters.
  EXPECT_NE(text.find("|     " + std::string(31, '^') + " "), std::string::npos) << text;
  std::string plain = ReportCarrying(TempPath("plain.py"), {"    y.mul_(2)", "    y = x"}, 1);
  EXPECT_NE(plain.find("|     ^^^^^^^^^ aten::mul_"), std::string::npos) << plain;
}

TEST(SourceQuoteTest, AFileHereThatDiffersIsSaidOnceAndNeverQuoted) {
  SourceRoots roots({::testing::TempDir()});
  std::string path = TempPath("edited.py");
  const std::string edited = "    y.add_(1)\n    z = x\n    w = 3\n";
  std::ofstream(path) << edited;
  // Line 2 was not recorded: this machine's line 2 belongs to another version of the file.
  std::string text = ReportCarrying(path, {"    y.mul_(2)"}, format::SourceHash(edited) + 1);
  EXPECT_NE(text.find("1 |     y.mul_(2)\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("y.add_(1)"), std::string::npos) << text;
  EXPECT_EQ(text.find("z = x"), std::string::npos) << text;
  const std::string kSaid = "on this machine differs from the file the run used";
  size_t said = text.find(kSaid);
  EXPECT_NE(said, std::string::npos) << text;
  EXPECT_EQ(text.find(kSaid, said + kSaid.size()), std::string::npos) << text;
  // The same file here (same hash): its unrecorded lines are quoted, nothing said.
  text = ReportCarrying(path, {"    y.add_(1)"}, format::SourceHash(edited));
  EXPECT_NE(text.find("2 |     z = x\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("differs"), std::string::npos) << text;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace torchrr::replayer
