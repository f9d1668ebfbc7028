// SilentWriteWatch: writes into a saved tensor's bytes that its version counter does not see.
//
// A write through a tensor that shares the saved tensor's storage but not its counter (`.data`,
// a detached alias) moves no counter, so autograd's version check passes and the gradients are
// silently wrong. The watch keeps, from the save to the node's run, each saved tensor in a list
// per storage, and notes the recorded writes whose bytes overlap it. With --verify-saved, whose
// fingerprints show that the bytes changed, it also notes every op that wrote into or made a
// tensor over those bytes (the candidates for a write the trace cannot show), including writes
// through another storage over the same memory.
//
// Lists are intrusive (links in SavedState), so watching and unwatching allocate nothing.
// Not thread-safe: it writes into the AnalysisState it was given, which must outlive it.
#ifndef TORCHRR_REPLAYER_SRC_SILENT_WRITES_H_
#define TORCHRR_REPLAYER_SRC_SILENT_WRITES_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "analysis_state.h"
#include "torchrr/format/records.h"

namespace torchrr::replayer {

class SilentWriteWatch {
 public:
  explicit SilentWriteWatch(AnalysisState& state) : state_(state) {}

  // Starts watching the node's checked saved tensors (from its NodeRecord on).
  void Watch(uint32_t node_slot);
  // Stops watching them (the node ran: later writes are fine). No-op for an unwatched node.
  void Unwatch(uint32_t node_slot);

  // `op` bumped `writer`'s counter: a watched saved tensor with another counter whose bytes it
  // overlaps was written silently.
  void OnWrite(format::ObjectId op, const TensorState& writer, format::ObjectId writer_counter);
  // Notes the op's writes into and aliases of fingerprinted saved tensors' bytes. Cheap when no
  // saved tensor has a fingerprint.
  void OnOp(const format::OpRecord& r);
  // A fingerprint of a saved tensor's bytes, at save or at use.
  void OnFingerprint(const format::FingerprintRecord& r);

  // The ops that wrote `s`'s bytes silently before record `seq`, in order; empty when none.
  std::vector<format::ObjectId> SilentWritersBefore(const SavedState& s, uint64_t seq) const;
  // The ops that wrote into or made a tensor over `s`'s bytes before record `seq`, in order, each
  // with whether it wrote.
  std::vector<std::pair<format::ObjectId, bool>> TouchesBefore(const SavedState& s,
                                                               uint64_t seq) const;

 private:
  // A write into a saved tensor's bytes through a tensor with another version counter.
  struct SilentWrite {
    format::ObjectId op = 0;
    uint64_t seq = 0;
    uint32_t next = UINT32_MAX;  // Next write into the same saved tensor.
  };

  // An op that wrote into, or made a tensor over, a fingerprinted saved tensor's bytes.
  struct StorageTouch {
    format::ObjectId op = 0;
    uint64_t seq = 0;
    bool wrote = false;          // A version bump; otherwise it made an alias (a view, detach()).
    uint32_t next = UINT32_MAX;  // Next touch of the same saved tensor.
  };

  uint32_t& StorageHead(format::ObjectId storage);
  template <typename Visit>
  void ForEachOverlappingWatched(const TensorState& tensor, Visit&& visit);
  void NoteWritesThroughOtherStorages(const format::OpRecord& r);
  void AddTouch(SavedState& s, format::ObjectId op, bool wrote);

  AnalysisState& state_;
  std::vector<uint32_t> storage_heads_;  // By storage slot: first watched saved slot.
  std::vector<SilentWrite> silent_writes_;
  std::vector<StorageTouch> touches_;
  uint64_t fingerprinted_ = 0;           // Saved tensors with a fingerprint at save.
  // Fingerprinted saved tensors with known addresses, watched for writes through other storages
  // over the same memory; entries whose node ran are dropped lazily.
  std::vector<uint32_t> addressed_saved_;
  size_t addressed_live_hint_ = 0;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_SRC_SILENT_WRITES_H_
