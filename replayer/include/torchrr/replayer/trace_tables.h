// TraceTables: what the verbs that draw a trace (export, report) need to name its records.
//
// A trace interns its strings, frames and stacks (records.h, "Identities") and writes a tensor's
// metadata once, before the records that use it. A verb that streams the records and wants an
// op's name, its user frame or a tensor's shape keeps the definitions seen so far; this class is
// that memory. It grows with the trace's distinct names, frames, stacks and tensors, not its ops.
// Not thread-safe.
#ifndef TORCHRR_REPLAYER_TRACE_TABLES_H_
#define TORCHRR_REPLAYER_TRACE_TABLES_H_

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchrr/format/records.h"
#include "torchrr/replayer/replayer.h"

namespace torchrr::replayer {

class TraceTables {
 public:
  // Keeps `record` when it defines a string, frame, stack or tensor; ignores the rest.
  void See(const format::Record& record);

  // The interned string `id`; "" for 0 or an id not defined yet.
  const std::string& String(format::InternId id) const;
  // "aten::mul_.Tensor": the op's name, then its overload when it has one.
  std::string OpName(const format::OpRecord& op) const;
  // The first frame of stack `id`, innermost first, that is not framework code; nullopt when the
  // stack is unknown or all framework.
  std::optional<replayer::UserFrame> UserFrameOf(format::InternId stack) const;
  // "file:line in function", or "" without a user frame.
  std::string Location(format::InternId stack) const;
  // The tensor's latest metadata, nullptr when none was recorded.
  const format::TensorInfo* Tensor(format::ObjectId id) const;
  // "float32[2, 32, 128]", or "tensor #id" when its metadata is unknown.
  std::string TensorText(format::ObjectId id) const;
  // A non-tensor argument as Python would write it: "2", "0.5", "True", "[2, 3]", "float32",
  // "cuda:0", "None", its string; "<TypeName>" for a value the recorder kept only the type of.
  std::string ValueText(const format::Value& value) const;

 private:
  std::unordered_map<format::InternId, std::string> strings_;
  std::unordered_map<format::InternId, format::FrameDef> frames_;
  std::unordered_map<format::InternId, std::vector<format::InternId>> stacks_;
  std::unordered_map<format::ObjectId, format::TensorInfo> tensors_;
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_TRACE_TABLES_H_
