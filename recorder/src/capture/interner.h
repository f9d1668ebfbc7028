// Interner: the strings, frames and stacks a trace defines once and names by id after.
//
// A record names an op's name, a file or a stack by a small InternId; the first use of each
// writes its definition (StringDef, FrameDef, StackDef) into the group being built, which reaches
// the trace before any record that names it. Lookups are by what the callbacks have at hand
// (a name pointer, a node's C++ type, a stack's return addresses) so that most ops build no
// string at all.
//
// Not thread-safe: the session calls it with its mutex held.
#ifndef TORCHRR_RECORDER_INTERNER_H_
#define TORCHRR_RECORDER_INTERNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include <c10/util/flat_hash_map.h>
#include <torch/csrc/autograd/function.h>

#include "stacks/python_stacks.h"
#include "sink/record_bytes.h"
#include "sink/trace_sink.h"
#include "torchrr/format/records.h"

namespace torchrr::recorder {

class Interner {
 public:
  // String and frame ids come from `sink`'s counters (its writer thread interns names too).
  explicit Interner(TraceSink& sink) : sink_(sink) {}

  // The id of `text` (0 for an empty one); a StringDef goes to `out` on first use.
  format::InternId String(std::string_view text, EncodedRecords& out);
  // The same for a name whose pointer is usually stable (an ATen op's, pointing into its
  // registered schema; the generated saved-variable table's literals): looked up by pointer,
  // checked against the text.
  format::InternId OpName(const char* name, EncodedRecords& out);
  // The node's name() interned, looked up by the node's C++ type (name() builds a string, often on
  // the heap); the names of Python functions' nodes (PyNode), which differ per class, are built
  // each time. `text`, when given, receives the name (valid until the next call);
  // `accumulate_grad` whether the node is an AccumulateGrad.
  format::InternId NodeName(const torch::autograd::Node& node, EncodedRecords& out,
                            const std::string** text = nullptr, bool* accumulate_grad = nullptr);
  // A stack of `n_pcs` native return addresses then `n_py` Python frames, innermost first; 0 when
  // both are empty. New native frames are queued unsymbolized (the writer thread symbolizes them).
  format::InternId Stack(const uintptr_t* pcs, size_t n_pcs, const PythonFrame* py, size_t n_py,
                         EncodedRecords& out);
  // What CapturePythonStack learnt of code objects first seen: their file and function names.
  void AddPythonCodes(std::vector<PythonCode>& codes);
  // After a dropped group: everything is defined again on next use.
  void Forget();

 private:
  // The FrameDef of a Python frame at `line` of `code` (a code id of python_codes_), its strings
  // defined into `out` on first use; no origin.
  format::FrameDef PythonFrameDef(format::InternId id, uint32_t code, int32_t line,
                                  EncodedRecords& out);
  // The FrameDef of a frame's origin (FrameDef.origin), defined into `out` on first use.
  format::InternId OriginFrame(uint32_t code, int32_t line, EncodedRecords& out);
  static uint64_t CodeLineKey(uint32_t code, int32_t line) {
    return (static_cast<uint64_t>(code) << 32) | static_cast<uint32_t>(line);
  }
  // A Python frame's key: code, line, origin code, origin line.
  struct PythonFrameKey {
    uint64_t at = 0;
    uint64_t origin = 0;
    bool operator==(const PythonFrameKey&) const = default;
  };
  struct PythonFrameKeyHash {
    size_t operator()(const PythonFrameKey& k) const {
      return std::hash<uint64_t>()(k.at * 0x9e3779b97f4a7c15ULL ^ k.origin);
    }
  };

  // Looked up by string_view: a name the callbacks get as a char* is not copied to be looked up.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>()(text); }
  };
  struct OpNameEntry {
    format::InternId id = 0;
    std::string text;  // What the pointer pointed to then.
  };
  struct NodeTypeName {
    format::InternId id = 0;
    std::string text;
    bool per_instance = false;  // PyNode: name() is the Python class's.
    bool accumulate_grad = false;
  };

  TraceSink& sink_;
  std::unordered_map<std::string, format::InternId, StringHash, std::equal_to<>> strings_;
  ska::flat_hash_map<const char*, OpNameEntry> op_names_;
  ska::flat_hash_map<const std::type_info*, NodeTypeName> node_type_names_;
  std::string node_name_;  // NodeName's, for names built each time.
  ska::flat_hash_map<uintptr_t, format::InternId> frames_;
  ska::flat_hash_map<PythonFrameKey, format::InternId, PythonFrameKeyHash> python_frames_;
  ska::flat_hash_map<uint64_t, format::InternId> origin_frames_;  // Key: code, line.
  std::unordered_map<uint32_t, PythonCode> python_codes_;         // Never forgotten.
  std::unordered_map<std::string, format::InternId> stacks_;      // Key: the frames' bytes.
  std::string stack_key_;  // Stack()'s key, reused (no allocation per op).
  format::InternId next_stack_id_ = 0;
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_INTERNER_H_
