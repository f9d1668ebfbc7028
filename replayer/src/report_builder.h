// BuildReport: what the analysis found, in the user's words.
//
// The analysis keeps ids (innermost ops, node and saved-tensor slots); a report names things: the
// op the user called and its line (not the kernel-level op inside it), the node and the saved
// tensor as PyTorch's message names them, PyTorch's own message, and warnings for what the trace
// could not settle. It also orders the violations: the one PyTorch stopped at comes first.
#ifndef TORCHRR_REPLAYER_SRC_REPORT_BUILDER_H_
#define TORCHRR_REPLAYER_SRC_REPORT_BUILDER_H_

#include "analysis_state.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

// The report for an analysis that has seen its whole trace. Reads `state` only.
Report BuildReport(const AnalysisState& state);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_REPORT_BUILDER_H_
