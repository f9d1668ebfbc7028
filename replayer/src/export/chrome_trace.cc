#include "torchrr/replayer/chrome_trace.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "torchrr/format/json.h"
#include "torchrr/replayer/trace_tables.h"

namespace torchrr::replayer {
namespace {

using Json = nlohmann::ordered_json;

// Tracks of the device: tids from here up, one per (device, stream), so that they never meet the
// recorder's logical thread ids (small numbers from RecordFunction).
constexpr int64_t kFirstStreamTid = 1'000'000'000;

const char* ScopeCategory(format::OpScope scope) {
  switch (scope) {
    case format::OpScope::kFunction:
      return "op";
    case format::OpScope::kBackwardFunction:
      return "backward";
    case format::OpScope::kUserScope:
      return "user_scope";
    default:
      return "other";
  }
}

}  // namespace

void ChromeTracePlan::SeeTime(int64_t ns) { first_ns_ = std::min(first_ns_, ns); }

void ChromeTracePlan::See(const format::Record& record) {
  if (const auto* op = std::get_if<format::OpRecord>(&record)) {
    SeeTime(op->start_ns);
  } else if (const auto* exec = std::get_if<format::NodeExecRecord>(&record)) {
    SeeTime(exec->start_ns);
    node_exec_ops_.insert(exec->op);
  } else if (const auto* kernel = std::get_if<format::CudaKernelRecord>(&record)) {
    SeeTime(kernel->start_ns);
    ++device_activities_;
    if (kernel->op != 0) launches_[kernel->op].push_back(device_activities_);
  } else if (const auto* copy = std::get_if<format::CudaMemcpyRecord>(&record)) {
    SeeTime(copy->start_ns);
    ++device_activities_;
    if (copy->op != 0) launches_[copy->op].push_back(device_activities_);
  }
}

const std::vector<uint64_t>* ChromeTracePlan::Launches(format::ObjectId op) const {
  auto it = launches_.find(op);
  return it == launches_.end() ? nullptr : &it->second;
}

class ChromeTraceWriter::Impl {
 public:
  Impl(std::ostream& out, const ChromeTracePlan& plan, const replayer::Report& report,
       const format::FileInfo& info)
      : out_(out), plan_(plan), report_(report), pid_(info.pid) {
    for (size_t i = 0; i < report.violations.size(); ++i) {
      const replayer::Violation& v = report.violations[i];
      // The instant goes where the saved tensor was used; a simulated use has no execution, so
      // it goes at the end of the write.
      if (v.node_exec_op != 0) {
        use_at_start_[v.node_exec_op].push_back(i);
      } else if (v.culprit && v.culprit->id != 0) {
        use_at_end_[v.culprit->id].push_back(i);
      } else {
        unplaced_.push_back(i);
      }
    }
    out_ << "{\"displayTimeUnit\":\"ns\",\"otherData\":"
         << format::JsonText(Json{{"producer", "torchrr"},
                          {"torchrr_version", info.torchrr_version},
                          {"torch_version", info.torch_version}})
         << ",\"traceEvents\":[\n";
    std::string process = info.command_line.empty() ? "torchrr trace" : info.command_line[0];
    for (size_t i = 1; i < info.command_line.size() && i < 4; ++i) {
      process += " " + info.command_line[i];
    }
    Emit(Json{{"ph", "M"},
              {"name", "process_name"},
              {"pid", pid_},
              {"tid", 0},
              {"args", {{"name", process + " (pid " + std::to_string(pid_) + ")"}}}});
  }

  void Add(const format::Record& record) {
    tables_.See(record);
    if (const auto* op = std::get_if<format::OpRecord>(&record)) {
      AddOp(*op);
    } else if (const auto* node = std::get_if<format::NodeRecord>(&record)) {
      node_names_[node->node] = tables_.String(node->name);
    } else if (const auto* exec = std::get_if<format::NodeExecRecord>(&record)) {
      AddNodeExecution(*exec);
    } else if (const auto* kernel = std::get_if<format::CudaKernelRecord>(&record)) {
      Json args{{"grid", {kernel->grid.x, kernel->grid.y, kernel->grid.z}},
                {"block", {kernel->block.x, kernel->block.y, kernel->block.z}},
                {"shared_memory", kernel->shared_memory},
                {"registers", kernel->registers},
                {"correlation", kernel->correlation}};
      AddDeviceActivity(tables_.String(kernel->name), "kernel", kernel->op, kernel->device,
                        kernel->stream, kernel->start_ns, kernel->end_ns, std::move(args));
    } else if (const auto* copy = std::get_if<format::CudaMemcpyRecord>(&record)) {
      Json args{{"bytes", copy->bytes}, {"correlation", copy->correlation}};
      AddDeviceActivity(std::string("[") + format::CudaCopyKindName(copy->kind) + "]", "memcpy",
                        copy->op, copy->device, copy->stream, copy->start_ns, copy->end_ns,
                        std::move(args));
    }
  }

  void Finish() {
    // A flow ends only where it started: a launching op that was not read (a damaged trace)
    // leaves its kernels without an arrow.
    for (const auto& [id, end] : flow_ends_) {
      if (flows_started_.contains(id)) Emit(end);
    }
    // Violations whose op was not read (a damaged trace) go at the end too.
    for (auto* anchors : {&use_at_start_, &use_at_end_}) {
      for (const auto& [op, indices] : *anchors) {
        unplaced_.insert(unplaced_.end(), indices.begin(), indices.end());
      }
    }
    std::sort(unplaced_.begin(), unplaced_.end());
    for (size_t i : unplaced_) {
      Json event = ViolationEvent(report_.violations[i], last_ns_, 0);
      event["s"] = "g";
      Emit(std::move(event));
    }
    out_ << "\n]}\n";
    out_.flush();
  }

 private:
  // {"ph":"X","name":"aten::mul_.Tensor","cat":"op","ts":12.5,"dur":3.1,"pid":1,"tid":2,
  //  "args":{"op":17,"inputs":[{"tensor":4,"type":"float32[2, 3]","version":"0->1"}],...}}
  void AddOp(const format::OpRecord& op) {
    Thread(op.thread);
    if (!plan_.IsNodeExecution(op.op)) {
      Json args{{"op", op.op}};
      if (!op.inputs.empty()) args["inputs"] = Uses(op.inputs);
      if (!op.outputs.empty()) args["outputs"] = Uses(op.outputs);
      for (const format::Value& value : op.values) {
        args["values"].push_back({{"position", value.position}, {"value", tables_.ValueText(value)}});
      }
      if (op.sequence_nr >= 0) args["sequence_nr"] = op.sequence_nr;
      if (!op.grad_mode) args["grad_mode"] = false;
      if (op.threw) args["threw"] = true;
      std::string location = tables_.Location(op.stack);
      if (!location.empty()) args["location"] = location;
      Emit(Slice(tables_.OpName(op), ScopeCategory(op.scope), op.thread, op.start_ns, op.end_ns,
                 std::move(args)));
    }
    if (const std::vector<uint64_t>* flows = plan_.Launches(op.op)) {
      // A flow starts inside the launching slice: at its start, on its thread.
      for (uint64_t id : *flows) {
        flows_started_.insert(id);
        Emit(Json{{"ph", "s"},
                  {"name", "launch"},
                  {"cat", "cuda"},
                  {"id", id},
                  {"ts", Micros(op.start_ns)},
                  {"pid", pid_},
                  {"tid", op.thread}});
      }
    }
    PlaceViolations(use_at_start_, op.op, op.start_ns, op.thread);
    PlaceViolations(use_at_end_, op.op, op.end_ns, op.thread);
  }

  void AddNodeExecution(const format::NodeExecRecord& exec) {
    Thread(exec.thread);
    auto name = node_names_.find(exec.node);
    Json args{{"node", exec.node}, {"op", exec.op}};
    if (exec.threw) args["threw"] = true;
    Emit(Slice(name == node_names_.end() || name->second.empty()
                   ? "node #" + std::to_string(exec.node)
                   : name->second,
               "autograd", exec.thread, exec.start_ns, exec.end_ns, std::move(args)));
  }

  void AddDeviceActivity(const std::string& name, const char* category, format::ObjectId op,
                         int device, uint32_t stream, int64_t start_ns, int64_t end_ns, Json args) {
    ++device_activities_;
    int64_t tid = StreamTrack(device, stream);
    if (op != 0) args["op"] = op;
    Emit(Slice(name, category, tid, start_ns, end_ns, std::move(args)));
    if (op != 0) {
      // "bp":"e": the flow ends at the slice that encloses it, the kernel's own.
      flow_ends_.emplace(device_activities_, Json{{"ph", "f"},
                                                  {"bp", "e"},
                                                  {"name", "launch"},
                                                  {"cat", "cuda"},
                                                  {"id", device_activities_},
                                                  {"ts", Micros(start_ns)},
                                                  {"pid", pid_},
                                                  {"tid", tid}});
    }
  }

  // Violations anchored at `op`, as instants on `thread` at `ns`.
  void PlaceViolations(std::unordered_map<format::ObjectId, std::vector<size_t>>& anchors,
                       format::ObjectId op, int64_t ns, int64_t thread) {
    auto it = anchors.find(op);
    if (it == anchors.end()) return;
    for (size_t i : it->second) Emit(ViolationEvent(report_.violations[i], ns, thread));
    anchors.erase(it);
  }

  // {"ph":"i","s":"t","name":"violation: version","args":{"culprit":"aten::mul_.Tensor",
  //  "culprit_location":"train.py:66 in forward","victim":"aten::sigmoid",...}}
  Json ViolationEvent(const replayer::Violation& v, int64_t ns, int64_t thread) {
    Json args{{"kind", replayer::ViolationKindName(v.kind)},
              {"backward_node", v.backward_node.name},
              {"saved_tensor", v.tensor.saved_name},
              {"tensor", v.tensor.id},
              {"saved_version", v.saved_version},
              {"used_version", v.current_version},
              {"pytorch_raised", v.pytorch_raised}};
    if (v.culprit) {
      args["culprit"] = OpText(*v.culprit);
      args["culprit_location"] = FrameText(v.culprit->user_frame);
    }
    if (v.victim) {
      args["victim"] = OpText(*v.victim);
      args["victim_location"] = FrameText(v.victim->user_frame);
    }
    if (v.simulated) args["simulated"] = true;
    if (v.pytorch_message) args["pytorch_message"] = *v.pytorch_message;
    return Json{{"ph", "i"},
                {"s", "t"},
                {"name", std::string("violation: ") + replayer::ViolationKindName(v.kind)},
                {"cat", "violation"},
                {"ts", Micros(ns)},
                {"pid", pid_},
                {"tid", thread},
                {"args", std::move(args)}};
  }

  static std::string OpText(const replayer::OpRef& op) {
    return op.overload.empty() ? op.name : op.name + "." + op.overload;
  }
  static std::string FrameText(const std::optional<replayer::UserFrame>& frame) {
    if (!frame) return "";
    return frame->file + ":" + std::to_string(frame->line) + " in " + frame->function;
  }

  Json Uses(const std::vector<format::TensorUse>& uses) const {
    Json list = Json::array();
    for (const format::TensorUse& use : uses) {
      Json one{{"tensor", use.tensor}, {"type", tables_.TensorText(use.tensor)}};
      one["version"] =
          use.version_after == use.version_before
              ? std::to_string(use.version_before)
              : std::to_string(use.version_before) + "->" + std::to_string(use.version_after);
      list.push_back(std::move(one));
    }
    return list;
  }

  Json Slice(const std::string& name, const char* category, int64_t tid, int64_t start_ns,
             int64_t end_ns, Json args) {
    last_ns_ = std::max(last_ns_, end_ns);
    return Json{{"ph", "X"},
                {"name", name},
                {"cat", category},
                {"ts", Micros(start_ns)},
                {"dur", static_cast<double>(std::max<int64_t>(end_ns - start_ns, 0)) / 1000.0},
                {"pid", pid_},
                {"tid", tid},
                {"args", std::move(args)}};
  }

  // Microseconds since the first timestamp; a timestamp before it (a damaged record) is 0.
  double Micros(int64_t ns) const {
    return static_cast<double>(std::max<int64_t>(ns - plan_.first_ns(), 0)) / 1000.0;
  }

  // Names the thread's track the first time it is seen.
  void Thread(uint32_t thread) {
    if (!threads_.insert(thread).second) return;
    Emit(Json{{"ph", "M"},
              {"name", "thread_name"},
              {"pid", pid_},
              {"tid", thread},
              {"args", {{"name", "thread " + std::to_string(thread)}}}});
  }

  int64_t StreamTrack(int device, uint32_t stream) {
    auto [it, added] = streams_.try_emplace({device, stream}, kFirstStreamTid + streams_.size());
    if (added) {
      Emit(Json{
          {"ph", "M"},
          {"name", "thread_name"},
          {"pid", pid_},
          {"tid", it->second},
          {"args",
           {{"name", "CUDA " + std::to_string(device) + " stream " + std::to_string(stream)}}}});
    }
    return it->second;
  }

  void Emit(const Json& event) {
    if (events_++ != 0) out_ << ",\n";
    out_ << format::JsonText(event);
  }

  std::ostream& out_;
  const ChromeTracePlan& plan_;
  const replayer::Report& report_;
  const int64_t pid_;
  TraceTables tables_;
  std::unordered_map<format::ObjectId, std::string> node_names_;
  std::unordered_set<uint32_t> threads_;
  std::map<std::pair<int, uint32_t>, int64_t> streams_;
  // Violation indices by the op whose start (the use) or end (a simulated use: the write) they
  // are shown at; entries are removed once shown.
  std::unordered_map<format::ObjectId, std::vector<size_t>> use_at_start_;
  std::unordered_map<format::ObjectId, std::vector<size_t>> use_at_end_;
  std::vector<size_t> unplaced_;  // Shown at the end, on the whole process.
  // Flows by id: the ends wait for Finish(), which writes those whose start was written.
  std::unordered_set<uint64_t> flows_started_;
  std::map<uint64_t, Json> flow_ends_;
  int64_t last_ns_ = 0;
  uint64_t device_activities_ = 0;  // Flow ids: the same count as the plan's.
  uint64_t events_ = 0;
};

ChromeTraceWriter::ChromeTraceWriter(std::ostream& out, const ChromeTracePlan& plan,
                                     const replayer::Report& report, const format::FileInfo& info)
    : impl_(std::make_unique<Impl>(out, plan, report, info)) {}
ChromeTraceWriter::~ChromeTraceWriter() = default;
void ChromeTraceWriter::Add(const format::Record& record) { impl_->Add(record); }
void ChromeTraceWriter::Finish() { impl_->Finish(); }

}  // namespace torchrr::replayer
