#include "torchrr/replayer/step_timeline.h"

#include <algorithm>
#include <variant>

#include <fmt/core.h>

#include "torchrr/replayer/html_report.h"

namespace torchrr::replayer {
namespace {

constexpr double kWidth = 960;
constexpr double kLabelWidth = 90;  // The thread names' column.
constexpr double kRowHeight = 26;
constexpr double kTop = 28;  // The legend's row.
constexpr double kAxisHeight = 30;
constexpr double kGapWidth = 14;    // A cut gap, whatever its length.
constexpr double kGapShare = 0.05;  // Gaps longer than this share of the run are cut.

const char* PhaseColor(StepTimeline::Phase phase) {
  switch (phase) {
    case StepTimeline::Phase::kForward:
      return "#60a5fa";
    case StepTimeline::Phase::kBackward:
      return "#f59e0b";
    case StepTimeline::Phase::kOptimizer:
      return "#34d399";
  }
  return "#9ca3af";
}

struct Mark {
  const char* what;  // "save", "write", "use"
  const char* color;
};
constexpr Mark kSave{"save", "#1d4ed8"};
constexpr Mark kWrite{"write", "#b91c1c"};
constexpr Mark kUse{"use", "#7c3aed"};

}  // namespace

StepTimeline::StepTimeline(const replayer::Report& report) : report_(report) {
  for (const replayer::Violation& v : report.violations) {
    if (v.victim) marked_.insert(v.victim->id);
    if (v.culprit) marked_.insert(v.culprit->id);
    if (v.node_exec_op != 0) marked_.insert(v.node_exec_op);
  }
}

void StepTimeline::Add(uint32_t thread, int64_t start_ns, int64_t end_ns, Phase phase) {
  first_ns_ = std::min(first_ns_, start_ns);
  last_ns_ = std::max(last_ns_, end_ns);
  threads_[thread].push_back({start_ns, end_ns, phase});
}

void StepTimeline::See(const format::Record& record, const TraceTables& names) {
  const auto* op = std::get_if<format::OpRecord>(&record);
  if (op == nullptr) return;
  if (marked_.contains(op->op)) marked_times_[op->op] = {op->thread, op->start_ns};
  if (op->parent != 0) return;
  Phase phase = Phase::kForward;
  if (op->scope == format::OpScope::kBackwardFunction) {
    phase = Phase::kBackward;
  } else if (op->scope == format::OpScope::kUserScope &&
             names.String(op->name).starts_with("Optimizer.")) {
    phase = Phase::kOptimizer;
  }
  Add(op->thread, op->start_ns, op->end_ns, phase);
}

// Where things go: x from a timestamp, y from a thread. Time runs left to right at one scale but
// across the gaps where no thread ran an op for a long while (importing torch, building the
// model, a checkpoint save): each is drawn kGapWidth wide, so that the step fills the width.
struct StepTimeline::Geometry {
  struct Segment {
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    double x0 = 0;
    double x1 = 0;
    bool gap = false;
  };
  std::vector<Segment> segments;  // In time order, covering first to last.
  std::map<uint32_t, double> row_y;
  double plot = 0;  // The width of the time axis.

  double X(int64_t ns) const {
    auto it = std::upper_bound(segments.begin(), segments.end(), ns,
                               [](int64_t t, const Segment& s) { return t < s.start_ns; });
    const Segment& s = it == segments.begin() ? segments.front() : *std::prev(it);
    if (s.end_ns <= s.start_ns) return s.x0;
    double f = static_cast<double>(std::clamp(ns, s.start_ns, s.end_ns) - s.start_ns) /
               static_cast<double>(s.end_ns - s.start_ns);
    return s.x0 + f * (s.x1 - s.x0);
  }
  // The time drawn at `x`, the inverse of X().
  int64_t Time(double x) const {
    for (const Segment& s : segments) {
      if (x <= s.x1 || &s == &segments.back()) {
        double f = s.x1 > s.x0 ? std::clamp((x - s.x0) / (s.x1 - s.x0), 0.0, 1.0) : 0.0;
        return s.start_ns + static_cast<int64_t>(f * static_cast<double>(s.end_ns - s.start_ns));
      }
    }
    return 0;
  }
};

StepTimeline::Geometry StepTimeline::Layout() const {
  Geometry g;
  g.plot = kWidth - kLabelWidth - 30;  // Room for the last tick's label.
  for (const auto& [thread, spans] : threads_) {
    g.row_y[thread] = kTop + kRowHeight * static_cast<double>(g.row_y.size());
  }
  // The busy stretches of all threads together; a gap longer than kGapShare of the whole is cut.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& [thread, list] : threads_) {
    for (const Span& span : list)
      spans.emplace_back(span.start_ns, std::max(span.end_ns, span.start_ns));
  }
  std::sort(spans.begin(), spans.end());
  const double min_gap = static_cast<double>(last_ns_ - first_ns_) * kGapShare;
  int64_t start = spans.front().first, end = spans.front().second;
  for (const auto& [s, e] : spans) {
    if (static_cast<double>(s - end) > min_gap) {
      g.segments.push_back({start, end});
      g.segments.push_back({end, s, 0, 0, true});
      start = s;
    }
    end = std::max(end, e);
  }
  g.segments.push_back({start, end});
  int64_t busy_ns = 0;
  size_t gaps = 0;
  for (const auto& segment : g.segments) {
    segment.gap ? ++gaps : busy_ns += segment.end_ns - segment.start_ns;
  }
  const double busy_px = g.plot - kGapWidth * static_cast<double>(gaps);
  double x = kLabelWidth;
  for (auto& segment : g.segments) {
    segment.x0 = x;
    x += segment.gap   ? kGapWidth
         : busy_ns > 0 ? busy_px * static_cast<double>(segment.end_ns - segment.start_ns) /
                             static_cast<double>(busy_ns)
                       : busy_px / static_cast<double>(g.segments.size() - gaps);
    segment.x1 = x;
  }
  return g;
}

std::string StepTimeline::Svg() const {
  if (threads_.empty() || last_ns_ <= first_ns_) return "";
  const Geometry g = Layout();
  const double height = kTop + kRowHeight * static_cast<double>(threads_.size()) + kAxisHeight;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"timeline\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" font-family=\"sans-serif\" font-size=\"11\">\n",
      kWidth, height, kWidth, height);
  EmitLegend(svg);
  for (const auto& [thread, spans] : threads_) EmitRow(g, thread, spans, svg);
  for (size_t i = 0; i < report_.violations.size(); ++i) EmitMarks(g, i, svg);
  EmitAxis(g, svg);
  svg += "</svg>";
  return svg;
}

// A swatch per phase, a line per mark:
//   <rect x="90.0" y="6" width="12" height="12" fill="#60a5fa"/><text ...>backward</text>
void StepTimeline::EmitLegend(std::string& svg) const {
  double x = kLabelWidth;
  for (auto [phase, label] :
       {std::pair{Phase::kForward, "forward and other ops"},
        std::pair{Phase::kBackward, "backward"}, std::pair{Phase::kOptimizer, "optimizer"}}) {
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"6\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"16\">{}</text>\n",
        x, PhaseColor(phase), x + 16, label);
    x += 150;
  }
  for (const Mark& mark : {kSave, kWrite, kUse}) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"5\" y2=\"19\" stroke=\"{1}\" "
        "stroke-width=\"2\"/><text x=\"{2:.1f}\" y=\"16\">{3}</text>\n",
        x, mark.color, x + 5, mark.what);
    x += 60;
  }
}

// A thread's row: its name, a grey band, and a rectangle per run of its outermost ops of one
// phase, runs closer than a pixel merged:
//   <text x="4" y="44.0">thread 1</text><rect x="..." y="31.0" width="..." fill="#f59e0b"/>
void StepTimeline::EmitRow(const Geometry& g, uint32_t thread, const std::vector<Span>& unsorted,
                           std::string& svg) const {
  double y = g.row_y.at(thread);
  svg += fmt::format("<text x=\"4\" y=\"{:.1f}\">thread {}</text>\n", y + 16, thread);
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"18\" fill=\"#f3f4f6\"/>\n",
      kLabelWidth, y + 3, g.plot);
  std::vector<Span> spans = unsorted;
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; });
  for (size_t i = 0; i < spans.size();) {
    Span merged = spans[i++];
    while (i < spans.size() && spans[i].phase == merged.phase &&
           g.X(spans[i].start_ns) - g.X(merged.end_ns) < 1.0) {
      merged.end_ns = std::max(merged.end_ns, spans[i++].end_ns);
    }
    double x = g.X(merged.start_ns);
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"18\" fill=\"{}\"/>\n", x, y + 3,
        std::max(g.X(merged.end_ns) - x, 1.0), PhaseColor(merged.phase));
  }
}

// Violation `index`'s save, write and use: a line across the row of the thread that ran the op,
// labelled with the mark's initial and the violation's number as the report numbers them, the op
// in its tooltip:
//   <g class="mark write"><title>#1 write: aten::mul_</title><line .../><text ...>w1</text></g>
void StepTimeline::EmitMarks(const Geometry& g, size_t index, std::string& svg) const {
  const replayer::Violation& v = report_.violations[index];
  auto mark = [&](format::ObjectId op, const Mark& what, const std::string& name) {
    auto it = marked_times_.find(op);
    if (op == 0 || it == marked_times_.end() || !g.row_y.contains(it->second.thread)) return;
    double x = g.X(it->second.start_ns);
    double y = g.row_y.at(it->second.thread);
    svg += fmt::format(
        "<g class=\"mark {0}\"><title>#{1} {0}: {2}</title><line x1=\"{3:.1f}\" x2=\"{3:.1f}\" "
        "y1=\"{4:.1f}\" y2=\"{5:.1f}\" stroke=\"{6}\" stroke-width=\"2\"/>"
        "<text x=\"{7:.1f}\" y=\"{8:.1f}\" fill=\"{6}\" font-size=\"9\">{9}{1}</text></g>\n",
        what.what, index + 1, HtmlEscape(name), x, y, y + kRowHeight, what.color, x + 2, y + 11,
        what.what[0]);
  };
  if (v.victim) mark(v.victim->id, kSave, v.victim->name);
  if (v.culprit) mark(v.culprit->id, kWrite, v.culprit->name);
  mark(v.node_exec_op, kUse, v.backward_node.name);
}

// Ten ticks, each labelled with the time drawn there in milliseconds from the first op, and each
// cut gap as a dashed box across the rows with its length in its tooltip:
//   <g class="gap"><title>1.62 s without a recorded op, not to scale</title><rect .../></g>
//   <line x1="90.0" .../><text x="90.0" y="..." text-anchor="middle">0.0 ms</text>
void StepTimeline::EmitAxis(const Geometry& g, std::string& svg) const {
  double y = kTop + kRowHeight * static_cast<double>(threads_.size()) + 4;
  for (const auto& segment : g.segments) {
    if (!segment.gap) continue;
    svg += fmt::format(
        "<g class=\"gap\"><title>{:.2f} s without a recorded op, not to scale</title>"
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#ffffff\" "
        "stroke=\"#9ca3af\" stroke-dasharray=\"2,2\"/></g>\n",
        static_cast<double>(segment.end_ns - segment.start_ns) / 1e9, segment.x0 + 2, kTop,
        segment.x1 - segment.x0 - 4, y - kTop - 2);
  }
  for (int tick = 0; tick <= 10; ++tick) {
    double x = kLabelWidth + g.plot * tick / 10;
    double ms = static_cast<double>(g.Time(x) - first_ns_) / 1e6;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#6b7280\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4:.1f} ms</text>\n",
        x, y, y + 5, y + 18, ms);
  }
}

}  // namespace torchrr::replayer
