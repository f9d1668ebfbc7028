// Graphviz's `dot`, the one outside program `torchrr report` runs: it lays out the autograd
// subgraph around a violation. The report inlines what it draws, so the HTML needs nothing at
// view time; without `dot` on PATH the report says so in place of the graph.
#ifndef TORCHRR_REPLAYER_GRAPHVIZ_H_
#define TORCHRR_REPLAYER_GRAPHVIZ_H_

#include <string>

#include "torchrr/format/status.h"

namespace torchrr::replayer {

// Runs `dot -Tsvg` (found on PATH) on the DOT source `graph` and returns the <svg> element it
// drew, without the XML prolog and DOCTYPE that HTML does not take. Errors: kIoError "dot not
// found (install graphviz)" when it cannot be run, kInvalidArgument when it draws nothing. Ignores
// SIGPIPE for the whole process from the first call on (a dot that exits early must make write()
// fail, not kill torchrr). Thread-safe (a child process per call).
format::StatusOr<std::string> DotToSvg(const std::string& graph);

// `text` as a DOT string literal's contents: quotes and backslashes escaped, newlines as "\n",
// other control characters and bytes that are not UTF-8 as replayer::Printable shows them.
std::string DotEscape(const std::string& text);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_GRAPHVIZ_H_
