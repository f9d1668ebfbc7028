// The recording options' table (recorder/include/torchrr/recording_options.def): every option
// has its names and an example that each way in reads back, the names follow one rule, and
// docs/recorder.md's table is the table's. How each option reaches RecorderOptions from the
// command line and from Python: tests/python/test_recording_options.py. No torch.
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "options/environment_options.h"
#include "torchrr/recording_options.h"

namespace torchrr {
namespace {

std::string Upper(std::string text) {
  for (char& c : text) c = (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  return text;
}

TEST(RecordingOptions, EachOptionIsNamedOnceByOneRule) {
  std::set<std::string> fields, variables, flags, keywords;
  for (const RecordingOption& option : RecordingOptions()) {
    SCOPED_TRACE(option.field);
    EXPECT_TRUE(fields.insert(option.field).second);
    EXPECT_TRUE(variables.insert(option.environment).second);
    EXPECT_TRUE(flags.insert(option.flag).second);
    EXPECT_TRUE(keywords.insert(option.keyword).second);
    EXPECT_EQ(option.environment, "TORCHRR_" + Upper(option.field));
    EXPECT_EQ(std::string(option.flag).rfind("--", 0), 0u);
    EXPECT_EQ(FindRecordingOption(option.field), &option);
    EXPECT_EQ(FindRecordingOptionByKeyword(option.keyword), &option);
    // Only a flag that takes a value is scaled; only a value has a value name.
    if (option.flag_value != nullptr) {
      EXPECT_EQ(option.flag_scale, 1u);
      EXPECT_STREQ(option.value_name, "");
    } else {
      EXPECT_STRNE(option.value_name, "");
    }
  }
}

TEST(RecordingOptions, EachExampleIsReadBackAndDiffersFromTheDefault) {
  const RecorderOptions defaults;
  for (const RecordingOption& option : RecordingOptions()) {
    SCOPED_TRACE(option.field);
    RecorderOptions options;
    EXPECT_EQ(option.set(option.example, &options), "");
    EXPECT_EQ(option.get(options), option.example);
    EXPECT_NE(option.get(defaults), option.example);
    RecorderOptions copied;
    option.copy(options, &copied);
    EXPECT_EQ(option.get(copied), option.example);
    // A flag's value is read too, and a value the option refuses (all but a path refuse this
    // one) leaves the field as it was.
    if (option.flag_value != nullptr) EXPECT_EQ(option.set(option.flag_value, &options), "");
    RecorderOptions refused;
    if (option.set("x:y", &refused).empty()) continue;
    EXPECT_EQ(option.get(refused), option.get(defaults));
  }
}

TEST(RecordingOptions, EachOptionIsReadFromTheEnvironment) {
  for (const RecordingOption& option : RecordingOptions()) {
    SCOPED_TRACE(option.environment);
    std::map<std::string, std::string> variables = {{"TORCHRR_OUTPUT", "run.trr"},
                                                    {option.environment, option.example}};
    std::optional<RecorderOptions> options = recorder::OptionsFromEnvironment(
        [&variables](const char* name) -> const char* {
          auto it = variables.find(name);
          return it == variables.end() ? nullptr : it->second.c_str();
        },
        false);
    ASSERT_TRUE(options);
    if (BrokenRelation([&option](const RecordingOption& o) { return &o == &option; })) {
      continue;  // Read only with what it needs: EnvironmentOptions.RelationsDropTheOption.
    }
    EXPECT_EQ(option.get(*options), option.example);
  }
}

TEST(RecordingOptions, KeywordsTakeSwitchWordsForFlags) {
  const RecordingOption* drop = FindRecordingOptionByKeyword("drop_when_full");
  ASSERT_NE(drop, nullptr);
  EXPECT_EQ(KeywordText(*drop, "1"), "drop");
  EXPECT_EQ(KeywordText(*drop, "0"), "wait");
  EXPECT_EQ(KeywordText(*FindRecordingOption("keep_last"), "4"), "4");
  // A switch's own words are its value, whatever its flag sets (--no-source sets 0).
  EXPECT_EQ(KeywordText(*FindRecordingOption("source"), "1"), "1");
  EXPECT_EQ(KeywordText(*FindRecordingOption("source"), "0"), "0");
  EXPECT_EQ(KeywordText(*FindRecordingOption("native_stacks"), "0"), "0");
}

TEST(RecordingOptions, StepRangesHaveOneParser) {
  std::string why;
  EXPECT_EQ(ParseStepRange("2:5"), (StepRange{2, 5}));
  EXPECT_EQ(ParseStepRange("7:"), (StepRange{7, UINT64_MAX}));
  EXPECT_EQ(ParseStepRange(":3"), (StepRange{0, 3}));
  EXPECT_FALSE(ParseStepRange("5:2", &why));
  EXPECT_EQ(why, "B is before A");
  for (const char* bad : {"", ":", "3", "a:b", "-1:2", "1:2:3"}) {
    EXPECT_FALSE(ParseStepRange(bad, &why)) << bad;
    EXPECT_EQ(why, "expected A:B, A: or :B (step numbers from 0)") << bad;
  }
}

// docs/recorder.md's table of options, between its markers, as the table gives it.
std::string DocsTable() {
  std::ostringstream table;
  table << "| Option | `torchrr record` | Python | Environment | Default |\n"
        << "|---|---|---|---|---|\n";
  const RecorderOptions native = DefaultRecorderOptions(false);
  const RecorderOptions python = DefaultRecorderOptions(true);
  auto shown = [](const std::string& value) { return value.empty() ? "none" : "`" + value + "`"; };
  for (const RecordingOption& option : RecordingOptions()) {
    if (*option.help == '\0') continue;
    std::string flag = option.flag;
    if (*option.value_name != '\0') flag += std::string(" ") + option.value_name;
    std::string value = shown(option.get(native));
    if (option.get(python) != option.get(native)) {
      value += " (C++), " + shown(option.get(python)) + " (Python)";
    }
    table << "| " << option.help << " | `" << flag << "` | `" << option.keyword << "` | `"
          << option.environment << "` | " << value << " |\n";
  }
  return table.str();
}

TEST(RecordingOptions, TheDocsTableIsTheTable) {
  std::ifstream file(std::string(TORCHRR_SOURCE_DIR) + "/docs/recorder.md");
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- recording options: begin -->\n";
  const std::string end = "<!-- recording options: end -->";
  const size_t from = doc.find(begin), to = doc.find(end);
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(doc.substr(from + begin.size(), to - from - begin.size()), DocsTable())
      << "docs/recorder.md's table, as recording_options.def gives it:\n"
      << DocsTable();
}

}  // namespace
}  // namespace torchrr
