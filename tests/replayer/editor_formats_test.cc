// The formats for editors and CI (editor_formats.h) on hand-built reports: GNU lines at the
// culprit's line, identical diagnostics merged, strings escaped; the SARIF log's rules, results,
// locations and invocations. tests/python/test_editor_formats.py checks a real recording's against
// the SARIF schema.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchrr/replayer/editor_formats.h"

namespace torchrr::replayer {
namespace {

OpRef Op(const std::string& name, const std::string& file, uint32_t line) {
  OpRef op;
  op.id = 7;
  op.name = name;
  if (!file.empty()) op.user_frame = UserFrame{file, line, "forward"};
  return op;
}

// aten::mul_ on train.py:12 wrote what aten::sigmoid on train.py:5 saved for SigmoidBackward0.
Violation MulAfterSigmoid(uint64_t pass = 0) {
  Violation v;
  v.culprit = Op("aten::mul_", "train.py", 12);
  v.victim = Op("aten::sigmoid", "train.py", 5);
  v.backward_node.name = "SigmoidBackward0";
  v.backward_pass = pass;
  v.saved_version = static_cast<uint32_t>(pass);  // Differs between steps: not in the message.
  v.current_version = static_cast<uint32_t>(pass + 1);
  return v;
}

ReplayedTrace Trace(const std::string& path, Report report, int rank = -1) {
  ReplayedTrace trace;
  trace.path = path;
  trace.rank = rank;
  report.ops = 10;
  trace.report = std::move(report);
  return trace;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(text.substr(start, end - start));
  }
  EXPECT_EQ(start, text.size()) << "the output ends without a newline: " << text;
  return lines;
}

// The column is the statement's first non-blank character where the source is at hand (the
// trace's copy), 1 where it is not; SARIF says the same as startColumn.
TEST(GnuFormatTest, TheColumnIsTheStatementsFirstCharacter) {
  Report report;
  report.violations.push_back(MulAfterSigmoid());
  report.sources["train.py"].text[12] = "        y.mul_(2)  # the bug";
  std::vector<std::string> lines = Lines(FormatGnu({Trace("run.trr", report)}));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_TRUE(lines[0].starts_with("train.py:12:9: error: ")) << lines[0];
  EXPECT_TRUE(lines[1].starts_with("train.py:5:1: note: ")) << lines[1];  // Not carried.
  const nlohmann::json log = ToSarif({Trace("run.trr", report)}, "0.0");
  const nlohmann::json& region =
      log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"];
  EXPECT_EQ(region["startLine"], 12);
  EXPECT_EQ(region["startColumn"], 9);
}

TEST(GnuFormatTest, ErrorAtTheCulpritNoteAtTheVictim) {
  Report report;
  report.violations.push_back(MulAfterSigmoid());
  std::vector<std::string> lines = Lines(FormatGnu({Trace("run.trr", report)}));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "train.py:12:1: error: saved tensor modified in place by aten::mul_; aten::sigmoid at "
            "train.py:5 saved it for SigmoidBackward0");
  EXPECT_EQ(lines[1],
            "train.py:5:1: note: aten::sigmoid saved the tensor here for SigmoidBackward0");
  EXPECT_EQ(lines[2],
            "train.py:12:1: note: help: make aten::mul_ out of place (aten::mul), or .clone() the "
            "tensor before modifying it");
}

TEST(GnuFormatTest, IdenticalViolationsAreOneLineWithACount) {
  Report report;
  for (uint64_t pass = 0; pass < 40; ++pass) report.violations.push_back(MulAfterSigmoid(pass));
  Violation other = MulAfterSigmoid();
  other.culprit = Op("aten::add_", "train.py", 13);
  report.violations.push_back(other);
  // The same bug on another rank is the same diagnostic.
  Report rank1;
  rank1.violations.push_back(MulAfterSigmoid());
  std::vector<std::string> lines =
      Lines(FormatGnu({Trace("run.rank0.trr", report, 0), Trace("run.rank1.trr", rank1, 1)}));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_TRUE(lines[0].starts_with("train.py:12:1: error: ")) << lines[0];
  EXPECT_TRUE(lines[0].ends_with("SigmoidBackward0 (41 times)")) << lines[0];
  EXPECT_TRUE(lines[3].starts_with("train.py:13:1: error: saved tensor modified in place by "
                                   "aten::add_;"))
      << lines[3];
}

TEST(GnuFormatTest, WithoutACulpritLineTheVictimsLine) {
  Report report;
  Violation unrecorded = MulAfterSigmoid();
  unrecorded.culprit.reset();
  report.violations.push_back(unrecorded);
  Violation freed = MulAfterSigmoid();
  freed.kind = ViolationKind::kFreed;
  freed.culprit.reset();
  freed.victim->user_frame.reset();
  report.violations.push_back(freed);
  std::vector<std::string> lines = Lines(FormatGnu({Trace("run.trr", report)}));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "train.py:5:1: error: saved tensor modified in place by a write outside any recorded "
            "op; aten::sigmoid at train.py:5 saved it for SigmoidBackward0");
  EXPECT_TRUE(lines[1].starts_with("train.py:5:1: note: help: ")) << lines[1];
  // No frame at all: the trace is the place.
  EXPECT_EQ(lines[2],
            "run.trr: error: saved tensor used after an earlier backward pass freed it; "
            "aten::sigmoid saved it for SigmoidBackward0");
  EXPECT_TRUE(lines[3].starts_with("run.trr: note: help: pass retain_graph=True")) << lines[3];
}

TEST(GnuFormatTest, ErrorsAndTraceStatesAreLinesToo) {
  Report report;
  report.unexplained_errors.push_back(
      UnexplainedError{Op("MulBackward0", "train.py", 20), "bad\nerror: forged"});
  report.program_error = ProgramError{"RuntimeError", "a leaf Variable", Op("aten::add_", "", 0)};
  report.data_loss_records = 1;
  ReplayedTrace unread;
  unread.path = "notes\x1b[2J.trr";
  unread.status = "not_a_trace";
  unread.message = "not a torchrr trace";
  std::vector<std::string> lines = Lines(FormatGnu({Trace("run.trr", report), unread}));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "train.py:20:1: error: backward raised an error torchrr does not explain, in "
            "MulBackward0: bad\\nerror: forged");
  EXPECT_EQ(lines[1],
            "run.trr: error: the program raised an error torchrr does not explain: RuntimeError: "
            "a leaf Variable (in aten::add_)");
  EXPECT_TRUE(lines[2].starts_with("run.trr: warning: the recording is incomplete")) << lines[2];
  EXPECT_EQ(lines[3],
            "notes\\x1b[2J.trr: error: trace not read (not_a_trace): not a torchrr trace");
}

TEST(GnuFormatTest, NothingToSayIsNothing) {
  EXPECT_EQ(FormatGnu({Trace("run.trr", Report{})}), "");
}

TEST(SarifTest, ARuleForEveryViolationKind) {
  nlohmann::json log = ToSarif({Trace("run.trr", Report{})}, "0.1.0");
  EXPECT_EQ(log["version"], "2.1.0");
  ASSERT_EQ(log["runs"].size(), 1u);
  const nlohmann::json& driver = log["runs"][0]["tool"]["driver"];
  EXPECT_EQ(driver["name"], "torchrr");
  EXPECT_EQ(driver["version"], "0.1.0");
  std::vector<std::string> ids;
  for (const nlohmann::json& rule : driver["rules"]) ids.push_back(rule["id"]);
  for (int kind = 0; kind <= static_cast<int>(ViolationKind::kCachedMutated); ++kind) {
    const char* name = ViolationKindName(static_cast<ViolationKind>(kind));
    EXPECT_NE(std::find(ids.begin(), ids.end(), name), ids.end()) << name;
  }
  EXPECT_EQ(log["runs"][0]["results"], nlohmann::json::array());
}

TEST(SarifTest, AResultAtTheCulpritWithTheVictimAndTheNode) {
  Report report;
  for (uint64_t pass = 0; pass < 3; ++pass) report.violations.push_back(MulAfterSigmoid(pass));
  report.violations[0].culprit->user_frame->file = "src/my model#1.py";
  report.violations[1].culprit->user_frame->file = "src/my model#1.py";
  report.violations[2].culprit->user_frame->file = "src/my model#1.py";
  report.violations[0].victim->user_frame->file = "/home/u/ü.py";
  report.violations[1].victim->user_frame->file = "/home/u/ü.py";
  report.violations[2].victim->user_frame->file = "/home/u/ü.py";
  nlohmann::json log = ToSarif({Trace("run.trr", report, 2)}, "0.1.0");
  const nlohmann::json& run = log["runs"][0];
  ASSERT_EQ(run["results"].size(), 1u);
  const nlohmann::json& result = run["results"][0];
  EXPECT_EQ(result["ruleId"], "version");
  EXPECT_EQ(run["tool"]["driver"]["rules"][result["ruleIndex"].get<size_t>()]["id"], "version");
  EXPECT_EQ(result["level"], "error");
  // Relative stays relative, against SRCROOT; every byte a URI may not hold is encoded.
  const nlohmann::json& at = result["locations"][0]["physicalLocation"];
  EXPECT_EQ(at["artifactLocation"]["uri"], "src/my%20model%231.py");
  EXPECT_EQ(at["artifactLocation"]["uriBaseId"], "SRCROOT");
  EXPECT_EQ(at["region"]["startLine"], 12);
  const nlohmann::json& victim = result["relatedLocations"][0];
  EXPECT_EQ(victim["physicalLocation"]["artifactLocation"]["uri"], "file:///home/u/%C3%BC.py");
  EXPECT_FALSE(victim["physicalLocation"]["artifactLocation"].contains("uriBaseId"));
  EXPECT_EQ(victim["physicalLocation"]["region"]["startLine"], 5);
  EXPECT_EQ(result["relatedLocations"][1]["logicalLocations"][0]["name"], "SigmoidBackward0");
  const nlohmann::json& properties = result["properties"];
  EXPECT_EQ(properties["kind"], "version");
  EXPECT_EQ(properties["count"], 3);
  EXPECT_EQ(properties["backward_pass"], 0);
  EXPECT_EQ(properties["backward_passes"], nlohmann::json({0, 1, 2}));
  EXPECT_EQ(properties["ranks"], nlohmann::json({2}));
}

TEST(SarifTest, AnUnreadTraceIsAFailedInvocation) {
  ReplayedTrace unread;
  unread.path = "/tmp/notes.trr";
  unread.status = "not_a_trace";
  unread.message = "not a torchrr trace";
  unread.exit_code = 3;
  Report silent;
  Violation v = MulAfterSigmoid();
  v.kind = ViolationKind::kSilent;
  v.evidence = SilentEvidence::kAliasedWrite;
  silent.violations.push_back(v);
  nlohmann::json log = ToSarif({Trace("run.trr", silent), unread}, "0.1.0");
  const nlohmann::json& invocations = log["runs"][0]["invocations"];
  ASSERT_EQ(invocations.size(), 2u);
  EXPECT_EQ(invocations[0]["executionSuccessful"], true);
  EXPECT_EQ(invocations[1]["executionSuccessful"], false);
  EXPECT_EQ(invocations[1]["exitCode"], 3);
  const nlohmann::json& notification = invocations[1]["toolExecutionNotifications"][0];
  EXPECT_EQ(notification["level"], "error");
  EXPECT_EQ(notification["message"]["text"], "trace not read (not_a_trace): not a torchrr trace");
  EXPECT_EQ(notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            "file:///tmp/notes.trr");
  const nlohmann::json& result = log["runs"][0]["results"][0];
  EXPECT_EQ(result["ruleId"], "silent");
  EXPECT_EQ(result["properties"]["evidence"], "aliased_write");
  EXPECT_EQ(result["properties"]["invocations"], nlohmann::json({0}));
}

}  // namespace
}  // namespace torchrr::replayer
