#include "torchrr/replayer/html_report.h"

#include <algorithm>
#include <cctype>

#include <fmt/core.h>

#include "torchrr/replayer/printable.h"

namespace torchrr::replayer {
namespace {

constexpr const char* kStyle = R"(
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1000px; color: #111827; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; border-bottom: 1px solid #e5e7eb; padding-bottom: 0.2em; }
.meta { color: #4b5563; }
.summary { font-weight: 600; }
pre.diagnostic { background: #111827; color: #f9fafb; padding: 1em; overflow-x: auto;
                 border-radius: 6px; font-size: 0.85em; line-height: 1.35; }
section.violation { margin-top: 2em; }
.culprit { color: #b91c1c; }
.graph { overflow-x: auto; border: 1px solid #e5e7eb; border-radius: 6px; padding: 0.5em; }
.graph svg { max-width: 100%; height: auto; }
.missing { color: #92400e; background: #fef3c7; padding: 0.5em 1em; border-radius: 6px; }
svg.timeline { border: 1px solid #e5e7eb; border-radius: 6px; }
pre.fix, pre.repro { background: #f9fafb; border: 1px solid #e5e7eb; border-radius: 6px;
                     padding: 1em; overflow-x: auto; font-size: 0.85em; }
pre.fix .del { color: #b91c1c; }
pre.fix .add { color: #15803d; }
)";

// The fix of one violation as `torchrr fix --json` gave it: a diff whose "-" and "+" lines are
// coloured, or the uncertain rewrite's reasons as they are.
std::string FixBlock(const std::string& fix) {
  std::string html = "<h3>Fix (torchrr fix)</h3>\n<pre class=\"fix\">";
  size_t start = 0;
  while (start < fix.size()) {
    size_t end = fix.find('\n', start);
    if (end == std::string::npos) end = fix.size();
    const std::string line = fix.substr(start, end - start);
    const bool file = line.starts_with("---") || line.starts_with("+++");
    const char* kind = file                   ? nullptr
                       : line.starts_with("-") ? "del"
                       : line.starts_with("+") ? "add"
                                               : nullptr;
    html += kind == nullptr ? HtmlEscape(line)
                            : fmt::format("<span class=\"{}\">{}</span>", kind, HtmlEscape(line));
    html += "\n";
    start = end + 1;
  }
  return html + "</pre>\n";
}

// The reproducer of one violation, folded: how many lines, a data: link that saves it as a file,
// and the script itself.
std::string ReproBlock(size_t index, const std::string& script) {
  const size_t lines = static_cast<size_t>(std::count(script.begin(), script.end(), '\n'));
  return fmt::format(
      "<h3>Reproducer (torchrr repro)</h3>\n<details><summary>A standalone script, {} lines, "
      "using only torch: <a download=\"repro_{}.py\" href=\"data:text/x-python;charset=utf-8,{}\">"
      "save it</a>, then run <code>python repro_{}.py</code></summary>\n<pre class=\"repro\">{}"
      "</pre></details>\n",
      lines, index + 1, DataUrlEscape(script), index + 1, HtmlEscapePrintable(script));
}

// FormatText's text without its last line (the summary, which the page shows once at the top).
std::string WithoutSummary(const std::string& text) {
  std::string out = text;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  size_t last = out.rfind('\n');
  return last == std::string::npos ? std::string() : out.substr(0, last + 1);
}

std::string LastLine(const std::string& text) {
  std::string out = text;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  size_t last = out.rfind('\n');
  return last == std::string::npos ? out : out.substr(last + 1);
}

// <h2>1. version: aten::mul_.Tensor at train.py:66</h2>
std::string ViolationTitle(size_t index, const replayer::Violation& v) {
  std::string title = fmt::format("{}. {}", index + 1, replayer::ViolationKindName(v.kind));
  if (v.culprit) {
    std::string name =
        v.culprit->overload.empty() ? v.culprit->name : v.culprit->name + "." + v.culprit->overload;
    title += ": <span class=\"culprit\">" + HtmlEscape(name);
    if (v.culprit->user_frame) {
      title += fmt::format(" at {}:{}", HtmlEscape(v.culprit->user_frame->file),
                           v.culprit->user_frame->line);
    }
    title += "</span>";
  }
  return title + " modified what " + HtmlEscape(v.backward_node.name) + " saved";
}

// One violation: its title, the replay's text for it alone, its graph.
std::string ViolationSection(size_t index, const HtmlReportParts& parts) {
  const replayer::Violation& v = parts.report->violations[index];
  replayer::Report one;
  one.violations = {v};
  one.sources = parts.report->sources;  // The code it quotes.
  std::string html = fmt::format("<section class=\"violation\" id=\"violation-{}\">\n<h2>{}</h2>\n",
                                 index + 1, ViolationTitle(index, v));
  html += "<pre class=\"diagnostic\">" +
          HtmlEscapePrintable(WithoutSummary(FormatText(one, false))) +
          "</pre>\n<h3>Autograd graph around it</h3>\n";
  const std::string& svg = index < parts.graph_svgs.size() ? parts.graph_svgs[index] : "";
  if (!svg.empty()) {
    html += "<div class=\"graph\">" + svg + "</div>\n";
  } else {
    const std::string& note = index < parts.graph_notes.size() ? parts.graph_notes[index] : "";
    html += "<p class=\"missing\">Graph not drawn: " +
            HtmlEscape(!note.empty()                    ? note
                       : parts.graph_problem.empty() ? std::string("no graph")
                                                      : parts.graph_problem) +
            "</p>\n";
  }
  if (index < parts.fixes.size() && !parts.fixes[index].empty()) html += FixBlock(parts.fixes[index]);
  if (index < parts.repro_scripts.size() && !parts.repro_scripts[index].empty()) {
    html += ReproBlock(index, parts.repro_scripts[index]);
  } else if (index < parts.repro_notes.size() && !parts.repro_notes[index].empty()) {
    html += "<h3>Reproducer (torchrr repro)</h3>\n<p class=\"missing\">No reproducer: " +
            HtmlEscape(parts.repro_notes[index]) + "</p>\n";
  }
  return html + "</section>\n";
}

}  // namespace

std::string DataUrlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::string HtmlEscape(const std::string& text) {
  return HtmlEscapePrintable(replayer::Printable(text));
}

std::string HtmlEscapePrintable(const std::string& printable) {
  std::string out;
  out.reserve(printable.size());
  for (char c : printable) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string HtmlReport(const HtmlReportParts& parts) {
  const replayer::Report& report = *parts.report;
  std::string full = FormatText(report, false);
  std::string html = std::string(kHtmlReportPrefix) +
                     fmt::format("{}</title>\n<style>{}</style>\n</head>\n<body>\n"
                                 "<h1>torchrr report</h1>\n",
                                 HtmlEscape(parts.trace_path), kStyle);
  const format::FileInfo& info = parts.summary->info;
  html += fmt::format("<p class=\"meta\">{} &middot; written by torchrr {}, torch {}</p>\n",
                      HtmlEscape(parts.trace_path), HtmlEscape(info.torchrr_version),
                      HtmlEscape(info.torch_version));
  html += "<p class=\"summary\">" + HtmlEscapePrintable(LastLine(full)) + "</p>\n";
  // What is not a violation: the recorder's stop, warnings, unexplained errors.
  replayer::Report rest = report;
  rest.violations.clear();
  rest.groups.clear();
  std::string notes = WithoutSummary(FormatText(rest, false));
  if (!notes.empty()) {
    html += "<pre class=\"diagnostic\">" + HtmlEscapePrintable(notes) + "</pre>\n";
  }
  html += "<h2>The step</h2>\n";
  html += parts.timeline_svg.empty() ? "<p class=\"missing\">The trace has no timed op.</p>\n"
                                     : parts.timeline_svg + "\n";
  for (size_t i = 0; i < report.violations.size(); ++i) html += ViolationSection(i, parts);
  html += "</body>\n</html>\n";
  return html;
}

}  // namespace torchrr::replayer
