// format/SPEC.md against the one declaration of the format's version (torchrr/format/version.h):
// the header table, the "Current version" line and the version log say what the writer writes,
// and every version in the log has its golden file, which reads as that version.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "torchrr/format/reader.h"
#include "torchrr/format/version.h"

namespace torchrr::format {
namespace {

std::string Spec() {
  std::ifstream in(TORCHRR_SPEC_PATH);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Version(int major, int minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// The value column of the header table's row for `field`.
std::string HeaderTableValue(const std::string& spec, const std::string& field) {
  std::smatch match;
  const std::regex row("\\n\\|[^|\\n]*\\|[^|\\n]*\\|\\s*" + field + "\\s*\\|\\s*([^|\\n]*?)\\s*\\|");
  if (!std::regex_search(spec, match, row)) return "<no row " + field + ">";
  return match[1];
}

TEST(SpecVersion, HeaderTableStatesTheVersionWritten) {
  const std::string spec = Spec();
  ASSERT_FALSE(spec.empty()) << TORCHRR_SPEC_PATH << " not read";
  EXPECT_EQ(HeaderTableValue(spec, "major"), std::to_string(kFormatMajor));
  EXPECT_EQ(HeaderTableValue(spec, "minor"), std::to_string(kFormatMinor));
  EXPECT_EQ(HeaderTableValue(spec, "oldest_reader_major"), std::to_string(kOldestReaderMajor));
  EXPECT_EQ(HeaderTableValue(spec, "oldest_reader_minor"),
            std::to_string(kOldestStepCodingReaderMinor) + " (step coding), else " +
                std::to_string(kOldestReaderMinor));
}

TEST(SpecVersion, CurrentVersionLineStatesTheVersionWritten) {
  const std::string line = "Current version: **" + Version(kFormatMajor, kFormatMinor) +
                           "** (oldest reader " + Version(kOldestReaderMajor,
                                                          kOldestStepCodingReaderMinor) +
                           " for a step-coded file, the writer's default; " +
                           Version(kOldestReaderMajor, kOldestReaderMinor) +
                           " for one written without step coding).";
  // As a reader sees the paragraph: line breaks are spaces.
  const std::string spec = std::regex_replace(Spec(), std::regex("\\s+"), " ");
  EXPECT_NE(spec.find(line), std::string::npos) << "SPEC.md lacks: " << line;
}

// The log's rows, in order, from 1.0 to the version written, each with its golden file.
TEST(SpecVersion, LogHasEveryVersionUpToTheOneWrittenEachWithItsGolden) {
  const std::string spec = Spec();
  const std::regex row("\\n\\| (\\d+)\\.(\\d+) +\\| ([^|]*?) +\\|");
  std::vector<std::pair<int, int>> versions;
  std::string last_oldest;
  for (auto it = std::sregex_iterator(spec.begin(), spec.end(), row); it != std::sregex_iterator();
       ++it) {
    versions.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
    last_oldest = (*it)[3];
  }
  ASSERT_FALSE(versions.empty()) << "no version log in SPEC.md";
  for (size_t i = 0; i < versions.size(); ++i) {
    EXPECT_EQ(versions[i], std::make_pair(1, static_cast<int>(i))) << "log row " << i;
  }
  EXPECT_EQ(versions.back(), std::make_pair(static_cast<int>(kFormatMajor),
                                            static_cast<int>(kFormatMinor)));
  EXPECT_EQ(last_oldest.rfind(Version(kOldestReaderMajor, kOldestStepCodingReaderMinor), 0), 0u)
      << "the last row's oldest reader: " << last_oldest;

  for (const auto& [major, minor] : versions) {
    const std::string path = std::string(TORCHRR_GOLDEN_DIR) + "/v" + std::to_string(major) +
                             "_" + std::to_string(minor) + ".trr";
    ASSERT_TRUE(std::filesystem::exists(path)) << "no golden file for " << path;
    const Trace trace = ReadTraceFileAll(path);
    EXPECT_TRUE(trace.summary.status.ok()) << path << ": " << trace.summary.status.message();
    EXPECT_EQ(trace.summary.header.major, major) << path;
    EXPECT_EQ(trace.summary.header.minor, minor) << path;
  }
}

}  // namespace
}  // namespace torchrr::format
