// format::OpenOutputFile, the one open of every file torchrr writes: what it refuses, what it
// replaces, and WriteAll and OutputFileBuffer's whole writes.
#include "torchrr/format/output_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <fstream>
#include <iterator>
#include <ostream>
#include <string>

namespace torchrr::format {
namespace {

constexpr std::string_view kOwn = "<!-- own -->";

std::string Path(const std::string& name) {
  std::string path = ::testing::TempDir() + "/output_file_test_" + name;
  ::unlink(path.c_str());
  return path;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

OutputFileOptions Own(bool force = false) {
  OutputFileOptions options;
  options.own_prefix = kOwn;
  options.replace_any_file = force;
  return options;
}

TEST(OutputFile, ReplacesOnlyItsOwnOrAnEmptyFileUnlessForced) {
  const std::string path = Path("script.py");
  Write(path, "print('the user's script')\n");
  StatusOr<int> fd = OpenOutputFile(path, Own(), true, true);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fd.status().message().ends_with(kNotReplaced)) << fd.status().message();
  EXPECT_FALSE(CheckOutputFile(path, Own()).ok());
  EXPECT_EQ(Read(path), "print('the user's script')\n");

  Write(path, std::string(kOwn) + " an earlier page");
  fd = OpenOutputFile(path, Own(), true, true);
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  ASSERT_TRUE(WriteAll(*fd, std::string(kOwn) + " new", path).ok());
  ::close(*fd);
  EXPECT_EQ(Read(path), std::string(kOwn) + " new");

  Write(path, "anything");
  fd = OpenOutputFile(path, Own(/*force=*/true), true, true);
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  ::close(*fd);
  EXPECT_EQ(Read(path), "");
}

TEST(OutputFile, NeverThroughALinkNorIntoAFifo) {
  const std::string target = Path("target");
  Write(target, "kept");
  const std::string link = Path("link");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  StatusOr<int> fd = OpenOutputFile(link, Own(true), true, true);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("symbolic link"), std::string::npos);
  EXPECT_EQ(Read(target), "kept");

  const std::string dangling = Path("dangling");
  const std::string elsewhere = Path("elsewhere");
  ASSERT_EQ(::symlink(elsewhere.c_str(), dangling.c_str()), 0);
  EXPECT_FALSE(OpenOutputFile(dangling, Own(true), true, true).ok());
  EXPECT_NE(::access(elsewhere.c_str(), F_OK), 0);

  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fd = OpenOutputFile(fifo, Own(true), true, true);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("not a regular file (a FIFO)"), std::string::npos);
  EXPECT_EQ(CheckOutputFile(fifo, Own(true)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOutputFile("", Own(true)).code(), StatusCode::kInvalidArgument);
}

TEST(OutputFile, CheckCreatesNothingAndSaysWhyANewFileCannotBe) {
  const std::string path = Path("new");
  EXPECT_TRUE(CheckOutputFile(path, Own()).ok());
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_EQ(CheckOutputFile("/nonexistent-dir/x.html", Own()).code(), StatusCode::kIoError);
}

TEST(OutputFile, BufferWritesEverythingOnce) {
  const std::string path = Path("stream.json");
  StatusOr<int> fd = OpenOutputFile(path, Own(), true, true);
  ASSERT_TRUE(fd.ok());
  std::string expected;
  {
    OutputFileBuffer buffer(*fd, path);
    std::ostream out(&buffer);
    for (int i = 0; i < 100000; ++i) {
      out << i << ',';
      expected += std::to_string(i) + ",";
    }
    out.flush();
    EXPECT_TRUE(buffer.Close().ok());
    EXPECT_TRUE(buffer.Close().ok());
  }
  EXPECT_EQ(Read(path), expected);
}

TEST(OutputFile, AFailedWriteSaysSo) {
  const std::string path = Path("closed");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  signal(SIGPIPE, SIG_IGN);
  Status written = WriteAll(fds[1], "x", path);
  EXPECT_EQ(written.code(), StatusCode::kIoError);
  EXPECT_NE(written.message().find(path + ": write:"), std::string::npos) << written.message();
  ::close(fds[1]);
}

}  // namespace
}  // namespace torchrr::format
