// Violations that are one diagnostic. A bug in a layer's forward breaks the same saved tensor at
// every step and in every layer built from that code: the report says it once, with where.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

// Kind, culprit line, victim line. Ops without a user line group by name, so that two unrelated
// unrecorded writes are not one.
using GroupKey = std::tuple<int, std::string, uint32_t, std::string, std::string, uint32_t,
                            std::string>;

GroupKey KeyOf(const Violation& v) {
  auto at = [](const std::optional<OpRef>& op) {
    if (!op) return std::make_tuple(std::string(), uint32_t{0}, std::string());
    if (!op->user_frame) return std::make_tuple(std::string(), uint32_t{0}, op->name);
    return std::make_tuple(op->user_frame->file, op->user_frame->line, std::string());
  };
  auto [culprit_file, culprit_line, culprit_name] = at(v.culprit);
  auto [victim_file, victim_line, victim_name] = at(v.victim);
  return {static_cast<int>(v.kind), culprit_file, culprit_line, culprit_name,
          victim_file,             victim_line,  victim_name};
}

}  // namespace

std::vector<ViolationGroup> GroupViolations(const std::vector<Violation>& violations) {
  std::vector<ViolationGroup> groups;
  std::map<GroupKey, size_t> by_key;
  for (size_t i = 0; i < violations.size(); ++i) {
    auto [it, inserted] = by_key.try_emplace(KeyOf(violations[i]), groups.size());
    if (inserted) groups.emplace_back();
    ViolationGroup& group = groups[it->second];
    group.violations.push_back(i);
    if (violations[i].step) group.steps.push_back(*violations[i].step);
  }
  for (ViolationGroup& group : groups) {
    std::sort(group.steps.begin(), group.steps.end());
    group.steps.erase(std::unique(group.steps.begin(), group.steps.end()), group.steps.end());
  }
  return groups;
}

std::string NumberRanges(const std::vector<uint64_t>& numbers) {
  std::string text;
  for (size_t i = 0; i < numbers.size();) {
    size_t j = i;
    while (j + 1 < numbers.size() && numbers[j + 1] == numbers[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(numbers[i]);
    if (j > i) text += "-" + std::to_string(numbers[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace torchrr::replayer
