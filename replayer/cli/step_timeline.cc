#include "step_timeline.h"

#include <algorithm>
#include <variant>

#include <fmt/core.h>

#include "html_report.h"

namespace torchrr::cli {
namespace {

constexpr double kWidth = 960;
constexpr double kLabelWidth = 90;  // The thread names' column.
constexpr double kRowHeight = 26;
constexpr double kTop = 28;  // The legend's row.
constexpr double kAxisHeight = 30;

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

// Where things go: x from a timestamp, y from a thread.
struct StepTimeline::Geometry {
  int64_t first_ns = 0;
  double ns_per_px = 1;
  double plot = 0;  // The width of the time axis.
  std::map<uint32_t, double> row_y;

  double X(int64_t ns) const {
    return kLabelWidth + static_cast<double>(ns - first_ns) / ns_per_px;
  }
};

std::string StepTimeline::Svg() const {
  if (threads_.empty() || last_ns_ <= first_ns_) return "";
  Geometry g;
  g.first_ns = first_ns_;
  g.plot = kWidth - kLabelWidth - 30;  // Room for the last tick's label.
  g.ns_per_px = static_cast<double>(last_ns_ - first_ns_) / g.plot;
  for (const auto& [thread, spans] : threads_) {
    g.row_y[thread] = kTop + kRowHeight * static_cast<double>(g.row_y.size());
  }
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
           static_cast<double>(spans[i].start_ns - merged.end_ns) < g.ns_per_px) {
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

// Ten ticks in milliseconds from the first op:
//   <line x1="90.0" .../><text x="90.0" y="..." text-anchor="middle">0.0 ms</text>
void StepTimeline::EmitAxis(const Geometry& g, std::string& svg) const {
  double y = kTop + kRowHeight * static_cast<double>(threads_.size()) + 4;
  for (int tick = 0; tick <= 10; ++tick) {
    double x = kLabelWidth + g.plot * tick / 10;
    double ms = static_cast<double>(last_ns_ - first_ns_) * tick / 10 / 1e6;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#6b7280\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4:.1f} ms</text>\n",
        x, y, y + 5, y + 18, ms);
  }
}

}  // namespace torchrr::cli
