// The few lines `torchrr record` prints after a recorded program ends, when its trace holds a
// violation: each distinct culprit and victim line with its code, the fix, and the commands for
// the rest. The whole report is text_report.cc's.
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "source_files.h"
#include "text_words.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {
namespace {

// Distinct places shown at most: the verdict stays within a screen.
constexpr size_t kMaxPlaces = 3;

using PlaceKey = std::tuple<std::string, uint32_t, std::string, uint32_t, int>;

PlaceKey KeyOf(const Violation& v) {
  auto at = [](const std::optional<OpRef>& op) {
    return op && op->user_frame ? std::make_pair(op->user_frame->file, op->user_frame->line)
                                : std::make_pair(std::string(), uint32_t{0});
  };
  auto [culprit_file, culprit_line] = at(v.culprit);
  auto [victim_file, victim_line] = at(v.victim);
  return {culprit_file, culprit_line, victim_file, victim_line, static_cast<int>(v.kind)};
}

// "       12 | y.mul_(2)" (indentation dropped), the line the full report would quote (SourceCache);
// "" when there is none.
std::string CodeLine(SourceCache& sources, const std::optional<OpRef>& op) {
  if (!op || !op->user_frame) return "";
  const std::string* line = sources.Line(op->user_frame->file, op->user_frame->line);
  const std::string code = line == nullptr ? "" : Unindented(*line);
  if (code.empty()) return "";
  std::string number = std::to_string(op->user_frame->line);
  return "    " + std::string(number.size() < 5 ? 5 - number.size() : 0, ' ') + number + " | " +
         code + "\n";
}

}  // namespace

std::string FormatShortVerdict(const Report& report, const std::string& trace) {
  if (report.violations.empty()) return "";
  // Places in the order of their first violation (the first is the one PyTorch stopped at).
  std::vector<PlaceKey> order;
  std::map<PlaceKey, std::pair<const Violation*, size_t>> places;
  for (const Violation& v : report.violations) {
    auto [it, inserted] = places.try_emplace(KeyOf(v), &v, 0);
    if (inserted) order.push_back(it->first);
    ++it->second.second;
  }
  const std::string shown = Printable(trace);
  const size_t n = report.violations.size();
  SourceCache sources(&report.sources);
  std::ostringstream out;
  out << "torchrr: " << n << " violation" << (n == 1 ? "" : "s") << " in " << shown;
  if (report.violations.front().pytorch_raised) out << "; the first is the error PyTorch raised";
  if (report.incomplete()) out << " (the recording is incomplete)";
  out << "\n";
  for (size_t i = 0; i < order.size() && i < kMaxPlaces; ++i) {
    const auto& [v, count] = places[order[i]];
    if (v->culprit) {
      out << "  culprit: " << Location(*v->culprit) << "\n"
          << CodeLine(sources, v->culprit) << "           " << CulpritLabel(*v) << "\n";
    } else {
      out << "  culprit: not recorded (the write happened outside any recorded op)\n";
    }
    if (v->changed_source) {
      out << "  values from: " << Location(*v->changed_source) << "\n"
          << CodeLine(sources, v->changed_source);
    }
    if (v->victim) {
      out << "  victim:  " << Location(*v->victim) << "\n" << CodeLine(sources, v->victim);
    }
    out << "  help: " << FixHint(*v) << "\n";
    if (count > 1) out << "  (" << count << " times)\n";
  }
  if (order.size() > kMaxPlaces) {
    const size_t more = order.size() - kMaxPlaces;
    out << "  and " << more << " more place" << (more == 1 ? "" : "s") << "\n";
  }
  std::string page = trace;
  if (page.ends_with(".trr")) page.resize(page.size() - 4);
  out << "the whole report: torchrr replay " << shown << "; as a page: torchrr report " << shown
      << " -o " << Printable(page) << ".html\n";
  return out.str();
}

}  // namespace torchrr::replayer
