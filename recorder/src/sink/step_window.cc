#include "sink/step_window.h"

#include <zstd.h>

#include <algorithm>
#include <deque>
#include <set>
#include <type_traits>
#include <variant>

#include "torchrr/format/record_fields.h"

namespace torchrr::recorder {
namespace {

// Calls fn(id) for every object id `record` names (the fields record_fields.h codes as ids), in
// nested structs and vectors of them too.
template <class Fn>
void ForEachId(const format::Record& record, Fn&& fn) {
  format::ForEachLeafField(record, [&](const auto& field, const auto& value) {
    if constexpr (std::remove_cvref_t<decltype(field)>::coding == format::Coding::kId) {
      if (value != 0) fn(value);
    }
  });
}

// What a step that leaves the window leaves behind for the ones after it: the interned
// definitions, and the latest record of each tensor and node.
bool IsDefinition(const format::Record& record) {
  return std::holds_alternative<format::TensorInfo>(record) ||
         std::holds_alternative<format::NodeRecord>(record) ||
         std::holds_alternative<format::StringDef>(record) ||
         std::holds_alternative<format::FrameDef>(record) ||
         std::holds_alternative<format::StackDef>(record) ||
         std::holds_alternative<format::SourceFile>(record) ||
         std::holds_alternative<format::SourceLines>(record);
}

}  // namespace

StepWindow::StepWindow(size_t keep_steps, size_t keep_bytes)
    : keep_steps_(std::max<size_t>(keep_steps, 1)), keep_bytes_(keep_bytes) {}

void StepWindow::KeepRange(uint64_t first, uint64_t last) {
  ranged_ = true;
  range_first_ = first;
  range_last_ = std::max(first, last);
}

void StepWindow::Add(const format::Record& record) {
  if (done_) return;
  if (const auto* mark = std::get_if<format::StepRecord>(&record)) {
    if (!mark->marked) return;  // Only the program's marks come this way.
    if (!marked_) {
      // The first mark: steps are the program's from here on, numbered from 0 as in a trace
      // written whole; what came before is no step, only what the steps may need from before.
      marked_ = true;
      for (const ClosedStep& step : closed_) ApplyToBefore(step.index, 0);
      closed_.clear();
      closed_bytes_ = 0;
      ApplyToBefore(open_index_, 0);
      open_.clear();
      open_index_ = StepIndex{};
      boundary_ = Cut{};
      open_mark_ = format::StepRecord{0, mark->time_ns, true};
      next_step_ = 1;
      ++changes_;
      return;
    }
    if (!open_.empty()) CloseStepAt(Whole());
    if (done_) return;
    open_mark_.time_ns = mark->time_ns;
    open_mark_.marked = true;
    return;
  }
  const auto* op = std::get_if<format::OpRecord>(&record);
  if (step_rule_.Add(record) && !marked_) {
    // A top-level op that made autograd nodes, after a backward pass: the next step's forward.
    CloseStepAt(boundary_);
    if (done_) return;
    open_mark_.time_ns = op->start_ns;
  }
  if (open_.empty() && open_mark_.time_ns == 0 && op != nullptr) open_mark_.time_ns = op->start_ns;
  if (const auto* error = std::get_if<format::ErrorRecord>(&record);
      error != nullptr && error->kind != format::ErrorKind::kCppException && !open_kept()) {
    KeepOutsideError(*error);
  }
  format::AppendRecordBytes(record, open_);
  if (IsDefinition(record)) format::AppendRecordBytes(record, open_index_.definitions);
  ForEachId(record, [&](format::ObjectId id) { open_index_.named.push_back(id); });
  if (op != nullptr && op->parent == 0) {
    boundary_ = Whole();
    // A step with no end in sight (no backward: inference, or a loop the rule does not fit) is
    // cut after a top-level op once it holds keep_bytes_ uncompressed, so memory stays bounded.
    if (open_.size() > keep_bytes_) {
      const int64_t next_start = op->end_ns;
      CloseStepAt(boundary_);
      if (done_) return;
      open_mark_.time_ns = next_start;
    }
  }
}

void StepWindow::KeepOutsideError(const format::ErrorRecord& error) {
  std::vector<format::Record> kept;
  // Its type's StringDef, when the open step defined it (it is then not written otherwise); an
  // earlier step's definitions are kept for good.
  const std::string_view definitions = open_index_.definitions.view();
  size_t pos = 0;
  while (const format::Record* record = reader_.Next(definitions, &pos)) {
    const auto* text = std::get_if<format::StringDef>(record);
    if (text != nullptr && text->id == error.type) {
      kept.push_back(*record);
      break;
    }
  }
  format::ErrorRecord outside = error;
  outside.op = 0;
  outside.stack = 0;
  kept.push_back(format::Record(outside));
  if (outside_errors_.size() == kMaxOutsideErrors) outside_errors_.pop_front();
  outside_errors_.push_back(std::move(kept));
}

void StepWindow::CloseStepAt(Cut cut) {
  const std::string_view all = open_.view();
  if (cut.bytes == 0) return;  // Nothing before the boundary: the open step goes on.
  ++changes_;
  ClosedStep step;
  step.mark = open_mark_;
  step.raw_bytes = cut.bytes;
  if (closed_bytes_ + cut.bytes <= std::min(kKeepUncompressedBytes, keep_bytes_)) {
    step.bytes.assign(all.substr(0, cut.bytes));
    step.stored = true;
  } else {
    step.stored = !Compress(all.substr(0, cut.bytes), &step.bytes);
  }
  // The index splits where the bytes do: what came after the cut begins the next step.
  const std::string_view definitions = open_index_.definitions.view();
  step.index.definitions.Append(definitions.data(), cut.definitions);
  step.index.named.assign(open_index_.named.begin(), open_index_.named.begin() + cut.named);
  StepIndex rest_index;
  rest_index.definitions.Append(definitions.data() + cut.definitions,
                                definitions.size() - cut.definitions);
  rest_index.named.assign(open_index_.named.begin() + cut.named, open_index_.named.end());
  open_index_ = std::move(rest_index);
  step.held_bytes = step.bytes.size() + step.index.bytes();
  closed_bytes_ += step.held_bytes;
  closed_.push_back(std::move(step));
  format::ByteBuffer rest;
  rest.Append(all.data() + cut.bytes, all.size() - cut.bytes);
  open_.swap(rest);
  boundary_ = Cut{};
  open_mark_ = format::StepRecord{};
  open_mark_.step = next_step_++;
  open_mark_.marked = marked_;
  if (ranged_ && open_mark_.step > range_last_) {
    // Past the range: what began the next step is not kept.
    done_ = true;
    open_.clear();
    open_index_ = StepIndex{};
  }
  Evict();
}

void StepWindow::Evict() {
  auto too_many = [&] {
    if (ranged_) return closed_.front().mark.step < range_first_;
    return closed_.size() + 1 > keep_steps_;
  };
  while (!closed_.empty() && (too_many() || closed_bytes_ > keep_bytes_)) {
    ClosedStep& oldest = closed_.front();
    ApplyToBefore(oldest.index, oldest.mark.step);
    closed_bytes_ -= oldest.held_bytes;
    closed_.pop_front();
  }
}

void StepWindow::ApplyToBefore(const StepIndex& index, uint64_t step) {
  const std::string_view definitions = index.definitions.view();
  size_t pos = 0;
  while (const format::Record* record = reader_.Next(definitions, &pos)) {
    if (const auto* tensor = std::get_if<format::TensorInfo>(record)) {
      tensors_[tensor->tensor] = {*tensor, step};
    } else if (const auto* node = std::get_if<format::NodeRecord>(record)) {
      nodes_[node->node] = {*node, step};
    } else {
      interned_.push_back(*record);
    }
  }
  for (format::ObjectId id : index.named) {
    if (auto t = tensors_.find(id); t != tensors_.end()) t->second.last_step = step;
    if (auto n = nodes_.find(id); n != nodes_.end()) n->second.last_step = step;
  }
  // Sweeping walks every entry, a cache miss each: once per kForgetAfterSteps steps, not per step.
  if (step < next_sweep_) return;
  next_sweep_ = step + kForgetAfterSteps;
  std::erase_if(tensors_, [&](const auto& entry) {
    return entry.second.last_step + kForgetAfterSteps < step;
  });
  std::erase_if(nodes_, [&](const auto& entry) {
    return entry.second.last_step + kForgetAfterSteps < step;
  });
}

format::Status StepWindow::WriteTo(format::TraceWriter& writer,
                                   std::set<format::ObjectId>* carried) {
  // The kept steps' bytes, oldest first; the open one last. Those kept as they are, and the open
  // step's, are read where they lie; `decompressed` holds the others' (a deque: views into its
  // strings stay valid as it grows).
  std::vector<std::pair<format::StepRecord, std::string_view>> steps;
  std::deque<std::string> decompressed;
  for (const ClosedStep& step : closed_) {
    bool ok = true;
    std::string_view bytes = Records(step, &decompressed.emplace_back(), &ok);
    if (!ok) return format::Status(format::StatusCode::kIoError, "a kept step does not decompress");
    steps.emplace_back(step.mark, bytes);
  }
  if (open_kept() && (!open_.empty() || carried != nullptr)) {
    steps.emplace_back(open_mark_, open_.view());
  }

  // What the kept steps name, from before them.
  std::set<format::ObjectId> named;
  for (const ClosedStep& step : closed_) {
    named.insert(step.index.named.begin(), step.index.named.end());
  }
  if (open_kept()) named.insert(open_index_.named.begin(), open_index_.named.end());

  for (const format::Record& record : interned_) {
    if (format::Status s = writer.Append(record); !s.ok()) return s;
  }
  std::set<format::ObjectId> written;
  if (carried == nullptr) carried = &written;
  if (format::Status s = WriteCarried({named.begin(), named.end()}, writer, carried); !s.ok()) {
    return s;
  }
  for (const auto& [mark, bytes] : steps) {
    if (format::Status s = writer.Append(format::Record(mark)); !s.ok()) return s;
    size_t pos = 0;
    while (const format::Record* record = reader_.Next(bytes, &pos)) {
      if (format::Status s = writer.Append(*record); !s.ok()) return s;
    }
  }
  for (const std::vector<format::Record>& records : outside_errors_) {
    for (const format::Record& record : records) {
      if (format::Status s = writer.Append(record); !s.ok()) return s;
    }
  }
  return format::Status::Ok();
}

format::Status StepWindow::AppendFollowing(const format::Record& record,
                                           format::TraceWriter& writer,
                                           std::set<format::ObjectId>* carried) {
  if (std::holds_alternative<format::StepRecord>(record)) return format::Status::Ok();
  std::vector<format::ObjectId> ids;
  ForEachId(record, [&](format::ObjectId id) {
    if (!carried->contains(id) && (tensors_.contains(id) || nodes_.contains(id))) {
      ids.push_back(id);
    }
  });
  if (!ids.empty()) {
    if (format::Status s = WriteCarried(std::move(ids), writer, carried); !s.ok()) return s;
  }
  return writer.Append(record);
}

format::Status StepWindow::WriteCarried(std::vector<format::ObjectId> ids,
                                        format::TraceWriter& writer,
                                        std::set<format::ObjectId>* carried) {
  // The closure of `ids` over what the before state's records name, tensors before nodes (a
  // NodeRecord names the tensors it saved), each in id order: the order a window written whole
  // has, so the replay meets a tensor's record before the node that saved it.
  std::set<format::ObjectId> tensors, nodes;
  while (!ids.empty()) {
    format::ObjectId id = ids.back();
    ids.pop_back();
    if (carried->contains(id)) continue;
    auto more = [&](format::ObjectId next) {
      if (!tensors.contains(next) && !nodes.contains(next)) ids.push_back(next);
    };
    if (auto t = tensors_.find(id); t != tensors_.end() && tensors.insert(id).second) {
      ForEachId(format::Record(t->second.record), more);
    }
    if (auto n = nodes_.find(id); n != nodes_.end() && nodes.insert(id).second) {
      ForEachId(format::Record(n->second.record), more);
    }
  }
  for (format::ObjectId id : tensors) {
    if (format::Status s = writer.Append(format::Record(tensors_.at(id).record)); !s.ok()) {
      return s;
    }
    carried->insert(id);
  }
  for (format::ObjectId id : nodes) {
    if (format::Status s = writer.Append(format::Record(nodes_.at(id).record)); !s.ok()) return s;
    carried->insert(id);
  }
  return format::Status::Ok();
}

bool StepWindow::Compress(std::string_view bytes, std::string* out) {
  out->resize(ZSTD_compressBound(bytes.size()));
  size_t n = ZSTD_compress(out->data(), out->size(), bytes.data(), bytes.size(), 1);
  if (ZSTD_isError(n)) {
    out->assign(bytes);  // Kept as it is.
    return false;
  }
  out->resize(n);
  out->shrink_to_fit();
  return true;
}

std::string_view StepWindow::Records(const ClosedStep& step, std::string* scratch, bool* ok) {
  *ok = true;
  if (step.stored) return step.bytes;
  scratch->assign(step.raw_bytes, '\0');
  size_t n = ZSTD_decompress(scratch->data(), scratch->size(), step.bytes.data(),
                             step.bytes.size());
  *ok = !ZSTD_isError(n) && n == step.raw_bytes;
  return *ok ? std::string_view(*scratch) : std::string_view();
}

}  // namespace torchrr::recorder
