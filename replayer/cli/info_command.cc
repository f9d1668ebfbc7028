// `torchrr info FILE`: who wrote the trace, whether it was closed cleanly, and what is in it.
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "torchrr/replayer/privacy.h"
#include "torchrr/format/json.h"
#include "torchrr/format/reader.h"
#include "torchrr/replayer/printable.h"

namespace torchrr::cli {
namespace {

// Record's alternative index of OpRecord.
constexpr size_t kOpKind = 4;
static_assert(std::is_same_v<std::variant_alternative_t<kOpKind, format::Record>, format::OpRecord>);

struct InfoOptions {
  std::string path;
  bool json = false;
};

std::string UtcTime(int64_t unix_ns) {
  std::time_t seconds = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  if (unix_ns <= 0 || gmtime_r(&seconds, &tm) == nullptr) return "unknown";
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The command line as one printable line: each argument escaped (replayer::Printable), quoted
// when it holds a space or a quote.
std::string Join(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) {
    if (!out.empty()) out += ' ';
    std::string shown = replayer::Printable(a);
    out += a.find_first_of(" \t\"'") == std::string::npos ? shown : "'" + shown + "'";
  }
  return out;
}

// Whether the recording covers the whole run: the recorder's own stop (ErrorKind::kRecorder), the
// records it lost, a file cut before the writer closed it, and a recording with no op at all.
struct Completeness {
  std::optional<std::string> stopped;  // The recorder's reason.
  uint64_t records_lost = 0;
  bool cut = false;    // The read ended truncated: the writer never closed the file.
  bool empty = false;  // No op record.

  void SeeRead(const format::ReadSummary& s) {
    cut = s.status.code() == format::StatusCode::kTruncated;
    empty = s.records_per_kind[kOpKind] == 0;
  }
  bool Complete() const { return !stopped && records_lost == 0 && !cut && !empty; }

  void See(const format::Record& record) {
    if (const auto* error = std::get_if<format::ErrorRecord>(&record)) {
      if (error->kind == format::ErrorKind::kRecorder && !stopped) stopped = error->message;
    } else if (const auto* loss = std::get_if<format::DataLossRecord>(&record)) {
      records_lost += loss->records;
    }
  }
  // "complete", or what is missing.
  std::string Describe() const {
    if (Complete()) return "complete";
    std::vector<std::string> missing;
    if (empty) missing.push_back("no op was recorded");
    if (cut) missing.push_back("the file ends before the recorder closed it");
    if (stopped) missing.push_back("stopped early: " + replayer::Printable(*stopped));
    if (records_lost != 0) missing.push_back(fmt::format("{} records lost", records_lost));
    return (empty && missing.size() == 1 ? "empty: " : "incomplete: ") +
           fmt::format("{}", fmt::join(missing, "; "));
  }
  nlohmann::json ToJson() const {
    return {{"complete", Complete()},
            {"empty", empty},
            {"cut", cut},
            {"stopped", stopped ? nlohmann::json(*stopped) : nlohmann::json(nullptr)},
            {"records_lost", records_lost}};
  }
};

// Whether the run put anything on a CUDA device: a tensor there, a kernel or a copy. The trace's
// CUDA version is that of the torch build, which a CPU-only run of a CUDA build also has.
struct CudaUse {
  bool used = false;

  void See(const format::Record& record) {
    if (used) return;
    if (const auto* tensor = std::get_if<format::TensorInfo>(&record)) {
      used = tensor->device.type == kCudaDeviceType;
    } else {
      used = std::holds_alternative<format::CudaKernelRecord>(record) ||
             std::holds_alternative<format::CudaMemcpyRecord>(record);
    }
  }
  // "torch 2.15, built with CUDA 13.2; this run used no CUDA device".
  std::string Describe(const format::FileInfo& info) const {
    if (info.cuda_version.empty()) return "a build without CUDA";
    return "built with CUDA " + replayer::Printable(info.cuda_version) +
           (used ? "; this run used a CUDA device" : "; this run used no CUDA device");
  }

  static constexpr int8_t kCudaDeviceType = 1;  // c10::DeviceType::CUDA.
};

// What a recorded op costs: the file, and the record chunks' payloads compressed and raw, divided
// by the op records. Absent from a trace that holds no op.
struct BytesPerOp {
  double file = 0;
  double compressed = 0;
  double raw = 0;

  static std::optional<BytesPerOp> Of(const format::ReadSummary& s) {
    uint64_t ops = s.records_per_kind[kOpKind];
    if (ops == 0) return std::nullopt;
    auto per_op = [ops](uint64_t bytes) {
      return static_cast<double>(bytes) / static_cast<double>(ops);
    };
    return BytesPerOp{per_op(s.file_size), per_op(s.compressed_bytes), per_op(s.raw_bytes)};
  }
  std::string Describe() const {
    return fmt::format("{:.2f} in the file, {:.2f} compressed ({:.1f} raw)", file, compressed,
                       raw);
  }
  nlohmann::json ToJson() const {
    return {{"file", file}, {"compressed", compressed}, {"raw", raw}};
  }
};

int RunInfo(const InfoOptions& options) {
  using format::ReadSummary;
  // Records are counted by the reader; only what says whether the recording is whole is kept.
  Completeness completeness;
  CudaUse cuda;
  replayer::PrivacyScan privacy;
  ReadSummary s = format::ReadTraceFile(options.path, [&](const format::Record& r) {
    completeness.See(r);
    cuda.See(r);
    privacy.See(r);
  });
  int rc = ReportRead(options.path, s);
  if (NothingRead(rc)) return rc;
  if (s.has_info) privacy.SeeInfo(s.info);
  completeness.SeeRead(s);
  const std::optional<BytesPerOp> bytes_per_op = BytesPerOp::Of(s);
  if (options.json) {
    nlohmann::json j = format::SummaryToJson(s);
    j["bytes_per_op"] = bytes_per_op ? bytes_per_op->ToJson() : nlohmann::json(nullptr);
    j["recording"] = completeness.ToJson();
    j["run_used_cuda"] = cuda.used;
    j["privacy"] = privacy.ToJson();
    fmt::print("{}\n", JsonText(j));
    return rc;
  }
  const format::FileInfo& info = s.info;
  fmt::print("file:             {} ({} bytes)\n", replayer::Printable(options.path), s.file_size);
  fmt::print("format:           {}.{} (oldest reader {}.{})\n", s.header.major, s.header.minor,
             s.header.oldest_reader_major, s.header.oldest_reader_minor);
  if (s.has_info) {
    fmt::print("written by:       torchrr {}, torch {} ({})\n",
               replayer::Printable(info.torchrr_version), replayer::Printable(info.torch_version),
               cuda.Describe(info));
    std::string rank = info.rank < 0 ? "not distributed"
                                     : fmt::format("rank {} of {}", info.rank, info.world_size);
    fmt::print("host:             {}, pid {}, {}\n", replayer::Printable(info.host), info.pid,
               rank);
    fmt::print("started:          {} ({} ns)\n", UtcTime(info.start_time_unix_ns),
               info.start_time_unix_ns);
    fmt::print("command line:     {}\n", Join(info.command_line));
  } else {
    fmt::print("written by:       unknown (no file info chunk)\n");
  }
  fmt::print("closed cleanly:   {}\n", s.has_index ? "yes" : "no");
  fmt::print("status:           {}\n", s.status.ok() ? "ok" : s.status.message());
  fmt::print("recording:        {}\n", completeness.Describe());
  fmt::print("chunks:           {}\n", s.chunks.size());
  fmt::print("records:          {}\n", s.records());
  for (size_t i = 0; i < format::kRecordKindCount; ++i) {
    if (s.records_per_kind[i] > 0) {
      fmt::print("  {:<16}{}\n", format::RecordKindNameAt(i), s.records_per_kind[i]);
    }
  }
  fmt::print("raw bytes:        {}\n", s.raw_bytes);
  fmt::print("compressed bytes: {}\n", s.compressed_bytes);
  if (bytes_per_op) fmt::print("bytes per op:     {}\n", bytes_per_op->Describe());
  fmt::print("privacy:          what this trace tells whoever reads it\n");
  for (const std::string& line : privacy.Lines()) fmt::print("{}\n", line);
  return rc;
}

}  // namespace

void RegisterInfoCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<InfoOptions>();
  CLI::App* info = app.add_subcommand("info", "Show a trace's header, writer and contents");
  AddTraceArgument(*info, &options->path);
  info->footer(ExitCodesFooter({kExitOk, kExitUsage, kExitNotATrace, kExitTruncated,
                                kExitCorrupt, kExitTooNew, kExitOther, kExitMemory}));
  info->add_flag("--json", options->json, "One JSON object instead of text");
  info->callback([options, exit_code] { *exit_code = RunInfo(*options); });
}

}  // namespace torchrr::cli
