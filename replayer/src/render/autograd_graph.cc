#include "torchrr/replayer/autograd_graph.h"

#include <deque>
#include <map>
#include <set>
#include <variant>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "torchrr/replayer/graphviz.h"

namespace torchrr::replayer {
namespace {

constexpr int kRadius = 2;
constexpr size_t kMaxNodes = 40;  // Beyond this dot's layout stops being readable in a report.
constexpr size_t kMaxEdges = 160;  // Four per node: a trace's node may list any number.

std::string Basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// "aten::mul_.Tensor\nmlp.py:12"
std::string OpLabel(const char* role, const replayer::OpRef& op) {
  std::string label =
      fmt::format("{}: {}", role, op.overload.empty() ? op.name : op.name + "." + op.overload);
  if (op.user_frame) {
    label += fmt::format("\n{}:{}", Basename(op.user_frame->file), op.user_frame->line);
  }
  return label;
}

}  // namespace

void AutogradGraph::See(const format::Record& record) {
  const auto* node = std::get_if<format::NodeRecord>(&record);
  if (node == nullptr) return;
  Node& kept = nodes_[node->node];
  kept.name = node->name;
  kept.next.clear();
  for (const format::Edge& edge : node->edges) {
    if (edge.node != 0) kept.next.push_back(edge.node);
  }
}

std::string AutogradGraph::Dot(const replayer::Violation& v, const TraceTables& names) const {
  const format::ObjectId center = v.backward_node.id;
  // Nodes by distance, breadth first over edges both ways.
  std::unordered_map<format::ObjectId, std::vector<format::ObjectId>> previous;
  for (const auto& [id, node] : nodes_) {
    for (format::ObjectId next : node.next) previous[next].push_back(id);
  }
  std::map<format::ObjectId, int> distance{{center, 0}};
  std::deque<format::ObjectId> queue{center};
  while (!queue.empty() && distance.size() < kMaxNodes) {
    format::ObjectId id = queue.front();
    queue.pop_front();
    if (distance[id] == kRadius) continue;
    std::vector<format::ObjectId> around;
    if (auto it = nodes_.find(id); it != nodes_.end()) around = it->second.next;
    if (auto it = previous.find(id); it != previous.end()) {
      around.insert(around.end(), it->second.begin(), it->second.end());
    }
    for (format::ObjectId other : around) {
      if (distance.size() >= kMaxNodes) break;
      if (distance.try_emplace(other, distance[id] + 1).second) queue.push_back(other);
    }
  }

  std::string dot =
      "digraph autograd {\n"
      "  rankdir=TB; bgcolor=\"transparent\";\n"
      "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#f3f4f6\", color=\"#9ca3af\", "
      "fontname=\"Helvetica\", fontsize=10];\n"
      "  edge [color=\"#6b7280\", fontname=\"Helvetica\", fontsize=9];\n";
  for (const auto& [id, d] : distance) {
    std::string name = v.backward_node.id == id && !v.backward_node.name.empty()
                           ? v.backward_node.name
                           : std::string();
    if (auto it = nodes_.find(id); name.empty() && it != nodes_.end()) {
      name = names.String(it->second.name);
    }
    if (name.empty()) name = "node";
    std::string style =
        id == center ? ", fillcolor=\"#fde68a\", color=\"#b45309\", penwidth=2" : "";
    dot += fmt::format("  n{} [label=\"{}\\n#{}\"{}];\n", id, DotEscape(name), id, style);
  }
  // Each edge once (a node's edges to one other are one line here), at most kMaxEdges.
  std::set<std::pair<format::ObjectId, format::ObjectId>> edges;
  for (const auto& [id, d] : distance) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;
    for (format::ObjectId next : it->second.next) {
      if (edges.size() >= kMaxEdges) break;
      if (distance.contains(next) && edges.emplace(id, next).second) {
        dot += fmt::format("  n{} -> n{};\n", id, next);
      }
    }
  }
  std::string shape =
      v.tensor.shape.empty() ? "" : fmt::format("[{}]", fmt::join(v.tensor.shape, ", "));
  std::string saved =
      fmt::format("saved `{}`\n{}{}\nsaved at version {}, used at {}", v.tensor.saved_name,
                  v.tensor.dtype, shape, v.saved_version, v.current_version);
  dot += fmt::format(
      "  saved [shape=note, label=\"{}\", fillcolor=\"#fef3c7\", color=\"#b45309\"];\n"
      "  saved -> n{} [style=dashed, label=\"needed by\", color=\"#b45309\"];\n",
      DotEscape(saved), center);
  if (v.victim) {
    dot += fmt::format(
        "  victim [label=\"{}\", fillcolor=\"#dbeafe\", color=\"#1d4ed8\"];\n"
        "  victim -> saved [label=\"saved\", color=\"#1d4ed8\"];\n",
        DotEscape(OpLabel("victim", *v.victim)));
  }
  if (v.culprit) {
    dot += fmt::format(
        "  culprit [label=\"{}\", fillcolor=\"#fee2e2\", color=\"#b91c1c\", penwidth=2];\n"
        "  culprit -> saved [label=\"wrote v{} -> v{}\", color=\"#b91c1c\", "
        "fontcolor=\"#b91c1c\"];\n",
        DotEscape(OpLabel("culprit", *v.culprit)), v.saved_version, v.current_version);
  }
  dot += "}\n";
  return dot;
}

}  // namespace torchrr::replayer
