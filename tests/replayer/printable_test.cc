// Strings from a trace printed to a terminal: every control character and every byte that is not
// UTF-8 shows as an escape (replayer::Printable), in the text report as everywhere else, so that a
// trace cannot drive the terminal or forge a line of the report.
#include <gtest/gtest.h>

#include <string>

#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"
#include "trace_builder.h"

namespace torchrr::replayer {
namespace {

using testing::kOutput;
using testing::TraceBuilder;

TEST(PrintableTest, CleanTextIsUnchanged) {
  for (const char* text : {"", "train.py", "aten::add_.Tensor", "/home/ana/café/train.py",
                           "模型.py", "loss 📉 at step 3", "it's \"quoted\""}) {
    EXPECT_EQ(Printable(text), text);
  }
}

TEST(PrintableTest, ControlsAndBadBytesAreEscaped) {
  EXPECT_EQ(Printable("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(Printable(std::string("\0\x01\x1b[2J\x7f", 7)), "\\x00\\x01\\x1b[2J\\x7f");
  EXPECT_EQ(Printable("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
  EXPECT_EQ(Printable("\xc2\x9b" "31m"), "\\u009b31m");             // C1 CSI.
  EXPECT_EQ(Printable("a\xe2\x80\xae" "b\xe2\x80\xa8"), "a\\u202eb\\u2028");  // RLO, LS.
  EXPECT_EQ(Printable("caf\xe9.py"), "caf\\xe9.py");                // Latin-1.
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");                   // Overlong '/'.
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");          // A surrogate.
  EXPECT_EQ(Printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // Past U+10FFFF.
  EXPECT_EQ(Printable("ok\xe6\xa8"), "ok\\xe6\\xa8");               // Cut inside a character.
  EXPECT_EQ(Printable("C:\\x1b"), "C:\\\\x1b");                     // A real backslash doubles.
  EXPECT_EQ(Printable("say \"hi\"", '"'), "say \\\"hi\\\"");
}

// A violation whose every string a trace controls carries escapes, line breaks and bytes that are
// not UTF-8: the report keeps its lines, shows the bytes, and prints no escape sequence.
TEST(PrintableTest, TheTextReportEscapesEveryTraceString) {
  const std::string file = "/tmp/caf\xe9/\x1b]0;pwned\x07train.py";
  const std::string function = "forward\nerror: forged by the trace";
  TraceBuilder b;
  auto x = b.Leaf({4});
  auto y = b.Forward("aten::sigmoid\x1b[2J", "SigmoidBackward0\r\nerror: forged", {x},
                     {{"result\x1b[8m", kOutput}}, b.At(2, file, function));
  b.Inplace("aten::mul_\xc2\x9b", y.out, {}, b.At(1, file, function), false);
  b.Backward({y.node}, y.node, "one of the variables...\nerror: forged message");
  std::string text = FormatText(Analyze(b.records), /*color=*/false);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.find("\xc2\x9b"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nerror: forged"), std::string::npos) << text;
  EXPECT_NE(text.find("--> /tmp/caf\\xe9/\\x1b]0;pwned\\x07train.py:1 in "
                      "forward\\nerror: forged by the trace\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("aten::mul_\\u009b"), std::string::npos) << text;
  EXPECT_NE(text.find("SigmoidBackward0\\r\\nerror: forged"), std::string::npos) << text;
  EXPECT_NE(text.find("saved `result\\x1b[8m`"), std::string::npos) << text;
  EXPECT_EQ(text.find("<unknown file>"), std::string::npos) << text;
  size_t errors = 0;
  for (size_t at = text.find("error:"); at != std::string::npos; at = text.find("error:", at + 1)) {
    if (at == 0 || text[at - 1] == '\n') ++errors;
  }
  EXPECT_EQ(errors, 1u) << text;  // The violation's own heading, and no forged one.
}

// A trace defines a string once and names it from any number of records: each verb keeps and
// shows it at most kMaxShownStringBytes long, with its length, so that a 1 MB name that every op
// uses costs kilobytes per use, not megabytes.
TEST(PrintableTest, LongStringsAreShortenedWithTheirLength) {
  EXPECT_EQ(Shortened("aten::mul_"), "aten::mul_");
  const std::string at_bound(kMaxShownStringBytes, 'a');
  EXPECT_EQ(Shortened(at_bound), at_bound);
  const std::string long_name(1 << 20, 'x');
  std::string shown = Shortened(long_name);
  EXPECT_LE(shown.size(), kMaxShownStringBytes);
  EXPECT_TRUE(shown.ends_with("... [1048576 bytes]")) << shown.substr(shown.size() - 40);
  // Never cut inside a UTF-8 character: "é" is 2 bytes; at every alignment the rest is whole.
  for (size_t pad = 0; pad < 4; ++pad) {
    std::string text(pad, 'a');
    while (text.size() < 2 * kMaxShownStringBytes) text += "\xc3\xa9";
    shown = Shortened(text);
    EXPECT_EQ(Printable(shown).find("\\x"), std::string::npos) << "cut inside a character";
  }
  // The text report of 1,000 writes by an op named with one 1 MB string: each names its op, in
  // 8 KiB at most (1 GB with the whole name).
  TraceBuilder b;
  auto x = b.Leaf({4});
  auto y = b.Forward("aten::sigmoid", "SigmoidBackward0", {x}, {{"result", kOutput}},
                     b.At(2, "train.py"));
  for (int i = 0; i < 1000; ++i) {
    b.Inplace(long_name, y.out, {}, b.At(1, "train.py"), false);
  }
  b.Backward({y.node}, y.node);
  const Report report = Analyze(b.records);
  const std::string text = FormatText(report, /*color=*/false);
  EXPECT_LT(text.size(), size_t{16} << 20);
  EXPECT_NE(text.find("... [1048576 bytes]"), std::string::npos);
}

// A trace whose node and saved member have no name (damaged, or written by a stranger): the report
// says so in words instead of printing an empty name and a `?`.
TEST(PrintableTest, UnnamedNodesAndMembersAreSaidToBeUnnamed) {
  TraceBuilder b;
  auto x = b.Leaf({4});
  auto y = b.Forward("aten::sigmoid", "", {x}, {{"", kOutput}}, b.At(2, "train.py"));
  b.Inplace("aten::mul_", y.out, {}, b.At(1, "train.py"), false);
  b.Backward({y.node}, y.node);
  std::string text = FormatText(Analyze(b.records), /*color=*/false);
  EXPECT_NE(text.find("needed by a node the trace does not name (#"), std::string::npos) << text;
  EXPECT_NE(text.find("(a saved tensor the trace does not name, an output of its op)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("`?`"), std::string::npos) << text;
}

}  // namespace
}  // namespace torchrr::replayer
