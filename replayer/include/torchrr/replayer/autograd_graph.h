// AutogradGraph: the autograd nodes a trace recorded and their edges, kept while the records
// stream by, to draw the part of the graph around a violation for `torchrr report`.
//
// Memory grows with the trace's nodes (a name id and the next functions of each), as the
// analysis' does. Not thread-safe.
#ifndef TORCHRR_REPLAYER_AUTOGRAD_GRAPH_H_
#define TORCHRR_REPLAYER_AUTOGRAD_GRAPH_H_

#include <string>
#include <unordered_map>
#include <vector>

#include "torchrr/format/records.h"
#include "torchrr/replayer/replayer.h"
#include "torchrr/replayer/trace_tables.h"

namespace torchrr::replayer {

class AutogradGraph {
 public:
  // Keeps `record` when it is a NodeRecord; ignores the rest.
  void See(const format::Record& record);

  // The DOT source (Graphviz) of the nodes within two edges of the node that needed the saved
  // tensor, both ways (at most 40 nodes, the nearest first), each edge pointing as gradients
  // flow, from a node to its next functions; the node is marked, and beside it the saved tensor,
  // the victim (the op that saved it) and the culprit (the op that wrote it), each with its line.
  // `names` resolves the node names (the trace's strings, read up to the end).
  std::string Dot(const replayer::Violation& violation, const TraceTables& names) const;

 private:
  struct Node {
    format::InternId name = 0;
    std::vector<format::ObjectId> next;  // Defined edges only.
  };
  std::unordered_map<format::ObjectId, Node> nodes_;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_AUTOGRAD_GRAPH_H_
