// The HTML page of `torchrr report`: one self-contained file (inline CSS, inline SVG, no script,
// nothing fetched), readable offline and attachable to a bug report.
//
// Layout: the trace and the replay's summary line; what the replay warns about; the step's
// timeline (step_timeline.h); then one section per violation, numbered as the timeline's marks,
// with the replay's own text for it (replayer::FormatText, so the verdict reads as in a terminal)
// and the autograd subgraph around it (autograd_graph.h, drawn by Graphviz), or why it is not
// drawn; its fix as a diff, when `torchrr fix --json`'s edits are given; and its reproducer
// (repro.h), shown folded and offered as a data: link to save, no script needed.
#ifndef TORCHRR_REPLAYER_HTML_REPORT_H_
#define TORCHRR_REPLAYER_HTML_REPORT_H_

#include <string>
#include <string_view>
#include <vector>

#include "torchrr/format/reader.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

struct HtmlReportParts {
  std::string trace_path;
  const format::ReadSummary* summary = nullptr;
  const replayer::Report* report = nullptr;
  std::string timeline_svg;             // "" when the trace has no timed op.
  std::vector<std::string> graph_svgs;  // One per violation; "" when not drawn.
  std::vector<std::string> graph_notes;  // Per violation not drawn: why (another drew its site).
  std::string graph_problem;            // Why graphs are not drawn; "" when they are.
  // Per violation (or fewer): the fix `torchrr fix --json` gave for it, as diff text ("--- a/..."
  // then "-old" and "+new" lines, or why it is not certain and the choices); "" for none.
  std::vector<std::string> fixes;
  // Per violation (or fewer): its reproducer's script (`torchrr repro`), or "" with why not in
  // repro_notes.
  std::vector<std::string> repro_scripts;
  std::vector<std::string> repro_notes;
};

// `text` as the body of a data: URL ("data:text/x-python;charset=utf-8," + this): every byte but
// the unreserved ones of RFC 3986 percent-encoded, so that no quote, `<` or newline is left.
std::string DataUrlEscape(std::string_view text);

// The whole page.
std::string HtmlReport(const HtmlReportParts& parts);

// How every page HtmlReport writes begins: `torchrr report -o` replaces an existing file only
// when it starts so (or with --force).
inline constexpr std::string_view kHtmlReportPrefix =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<title>torchrr report: ";

// A string from the trace for HTML text and attribute values: its control characters and bytes
// that are not UTF-8 escaped first (replayer::Printable), then &, <, >, " and '.
std::string HtmlEscape(const std::string& text);
// The same for text that is printable already (FormatText's lines): only &, <, >, " and ', so
// that its own newlines stay and its escapes are not escaped twice.
std::string HtmlEscapePrintable(const std::string& printable);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_HTML_REPORT_H_
