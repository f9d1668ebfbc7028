// ContentLineage: what each storage's bytes were last computed from, as a 64-bit digest.
//
// A write into a saved tensor between its save and its use is a violation only when it changed
// what backward reads. FSDP2 frees an unsharded parameter's storage after forward and all-gathers
// it again before backward, under a preserved counter
// (torch.autograd._unsafe_preserve_version_counter): the bytes backward reads are the ones forward
// saved, and PyTorch is right to stay silent. Values are not in
// a trace, but where they came from is: a storage's lineage is the digest of the op that last
// wrote it (name, overload, non-tensor arguments) and of the lineages of the storages it read.
// Two writes with the same lineage wrote the same bytes, as far as the trace can tell: the same
// ops over the same, unwritten sources (FSDP2's sharded parameters, until an optimizer step writes
// them and every lineage computed from them changes).
//
// Rules, per OpRecord (written at its end; nested ops come first, and the outermost op's rule is
// the one that stands):
//   - an argument whose version moved was written: its storage's lineage becomes the op's digest
//     over the lineages of the arguments it read, plus its own earlier lineage unless the op
//     overwrites what it writes (copies, fills) through a tensor over the whole storage;
//   - a collective (c10d::) leaves what it writes as it was: see IsCollective;
//   - an output on a storage none of the arguments share is new: its lineage is the op's digest
//     and its position; the digest of an op that makes random bytes (randn, dropout, bernoulli_)
//     holds its own id, so that no two calls are taken for the same bytes;
//   - a storage no recorded op wrote or made has a lineage of its own id.
// It errs towards "different" (a write the trace shows in another order makes two lineages differ
// for equal bytes), with two exceptions: a write the recorder did not see at all (no version
// moved), which no rule here can catch (--verify-saved's fingerprints do), and the bytes other
// ranks bring into a collective, taken to change only when this rank's contribution does. A write
// through a wrapper subclass (a DTensor) changes the wrapper's lineage, not its shard's: the
// caller does not trust a restoration across a write to a wrapper parameter, or, in a trace that
// does not tie wrappers to their shards, to any parameter
// (BackwardReplay::ParameterWrittenBetween).
//
// Not thread-safe; reads tensors from the AnalysisState it was given, which must outlive it.
#ifndef TORCHRR_REPLAYER_SRC_CONTENT_LINEAGE_H_
#define TORCHRR_REPLAYER_SRC_CONTENT_LINEAGE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "analysis_state.h"
#include "id_index.h"
#include "torchrr/format/records.h"

namespace torchrr::replayer {

class ContentLineage {
 public:
  explicit ContentLineage(const AnalysisState& state) : state_(state) {}

  // Call for each OpRecord before its writes are tracked, so that a write's Bump can take the
  // lineage it left (Of).
  void OnOp(const format::OpRecord& r);
  // The lineage of `storage`'s bytes now; never 0. 0 for storage 0 (no storage).
  uint64_t Of(format::ObjectId storage) const;

 private:
  // What the lineage needs to know of an op's name, worked out once per interned string.
  struct NameTraits {
    uint64_t hash = 0;  // Of the text; 0: not worked out yet.
    bool fresh = false;
    bool collective = false;
    bool overwrites = false;
  };
  const NameTraits& TraitsOf(format::InternId id);
  // Whether a write through `tensor` covers all of its storage's bytes.
  bool CoversItsStorage(const TensorState& tensor) const;

  const AnalysisState& state_;
  void Set(format::ObjectId storage, uint64_t lineage);

  IdIndex slots_;                                           // Storage ids to lineage_ slots.
  std::vector<uint64_t> lineage_;                           // Of storages once written or made.
  std::vector<uint64_t> scratch_;                           // The digest's words.
  std::vector<format::ObjectId> read_storages_;             // Scratch: storages read.
  std::vector<format::ObjectId> written_storages_;          // Scratch: storages written.
  std::vector<bool> written_whole_;                         // Scratch: each written whole.
  std::vector<uint64_t> old_;                               // Scratch: their lineages before.
  std::vector<std::pair<size_t, format::ObjectId>> made_;   // Scratch: (output, new storage).
  std::vector<NameTraits> traits_;                          // By InternId.
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_CONTENT_LINEAGE_H_
