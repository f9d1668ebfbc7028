// Violations that are one diagnostic. A bug in a layer's forward breaks the same saved tensor at
// every step and in every layer built from that code: the report says it once, with where.
#include <algorithm>
#include <map>
#include <optional>
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

// Modules a group lists at most: a model has a few hundred layers; a hostile trace is bounded.
constexpr size_t kMaxModules = 1024;

// "layers.1.mlp (LlamaMLP)" -> {"layers", "1", "mlp"} and " (LlamaMLP)".
std::pair<std::vector<std::string>, std::string> SplitModule(const std::string& module) {
  std::vector<std::string> parts;
  size_t cls = module.rfind(" (");
  if (cls == std::string::npos || module.starts_with("(")) cls = 0;
  const std::string path = module.substr(0, cls);
  for (size_t at = 0; at <= path.size() && !path.empty();) {
    size_t dot = path.find('.', at);
    if (dot == std::string::npos) dot = path.size();
    parts.push_back(path.substr(at, dot - at));
    at = dot + 1;
  }
  return {parts, module.substr(cls)};
}

bool AllDigits(const std::string& s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::string ModuleRanges(const std::vector<std::string>& modules) {
  if (modules.empty()) return "";
  if (modules.size() == 1) return modules[0];
  // The same path but for one index (the layer): "layers.0-1.mlp (LlamaMLP)".
  const auto [first_parts, first_class] = SplitModule(modules[0]);
  std::optional<size_t> varying;
  std::vector<uint64_t> indices;
  bool one_index = !first_parts.empty();
  for (const std::string& module : modules) {
    if (!one_index) break;
    const auto [parts, cls] = SplitModule(module);
    if (parts.size() != first_parts.size() || cls != first_class) {
      one_index = false;
      break;
    }
    for (size_t i = 0; i < parts.size() && one_index; ++i) {
      if (parts[i] == first_parts[i] && (!varying || *varying != i)) continue;
      if (!AllDigits(parts[i]) || !AllDigits(first_parts[i]) || (varying && *varying != i)) {
        one_index = false;
      } else {
        varying = i;
      }
    }
  }
  if (one_index && varying) {
    for (const std::string& module : modules) {
      indices.push_back(std::stoull(SplitModule(module).first[*varying]));
    }
    std::sort(indices.begin(), indices.end());
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    std::string ranges = NumberRanges(indices);
    if (ranges.find(',') != std::string::npos) ranges = "{" + ranges + "}";
    std::string text;
    for (size_t i = 0; i < first_parts.size(); ++i) {
      text += (i ? "." : "") + (i == *varying ? ranges : first_parts[i]);
    }
    return text + first_class;
  }
  constexpr size_t kListed = 3;
  std::string text;
  for (size_t i = 0; i < modules.size() && i < kListed; ++i) text += (i ? ", " : "") + modules[i];
  if (modules.size() > kListed) text += " and " + std::to_string(modules.size() - kListed) + " more";
  return text;
}

std::vector<ViolationGroup> GroupViolations(const std::vector<Violation>& violations) {
  std::vector<ViolationGroup> groups;
  std::map<GroupKey, size_t> by_key;
  for (size_t i = 0; i < violations.size(); ++i) {
    auto [it, inserted] = by_key.try_emplace(KeyOf(violations[i]), groups.size());
    if (inserted) groups.emplace_back();
    ViolationGroup& group = groups[it->second];
    group.violations.push_back(i);
    const Violation& v = violations[i];
    if (v.step) group.steps.push_back(*v.step);
    const std::optional<OpRef>& op = v.culprit ? v.culprit : v.victim;
    if (op && !op->module.empty() && group.modules.size() < kMaxModules &&
        std::find(group.modules.begin(), group.modules.end(), op->module) == group.modules.end()) {
      group.modules.push_back(op->module);
    }
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
