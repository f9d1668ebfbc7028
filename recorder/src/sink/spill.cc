// --spill: the kept steps also on disk, in one file rotated as each step ends.
#include "sink/trace_sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

namespace torchrr::recorder {

void TraceSink::Spill(const format::Record& record) {
  if (!spill_ || window_->changes() != spill_changes_) {
    RotateSpill();
    return;
  }
  format::Status status = window_->AppendFollowing(record, *spill_, &spill_carried_);
  if (!status.ok()) StopSpilling(status.message());
}

void TraceSink::RotateSpill() {
  char step[32];
  std::snprintf(step, sizeof step, "%08llu.trr",
                static_cast<unsigned long long>(window_->steps_seen() - 1));
  const std::string path = spill_prefix_ + step;
  if (path == spill_path_) EndSpill(/*remove=*/true);  // Renumbered by the first mark.
  format::WriterOptions writer_options;
  writer_options.zstd_level = options_.zstd_level;
  auto opened = format::TraceWriter::Open(path, info_, writer_options);
  if (!opened.ok()) {
    StopSpilling(opened.status().message());
    return;
  }
  std::unique_ptr<format::TraceWriter> next = std::move(opened.value());
  std::set<format::ObjectId> carried;
  format::Status status = window_->WriteTo(*next, &carried);
  if (status.ok()) status = next->Flush();
  if (!status.ok()) {
    next.reset();
    ::unlink(path.c_str());
    StopSpilling(status.message());
    return;
  }
  EndSpill(/*remove=*/true);
  spill_ = std::move(next);
  spill_path_ = path;
  spill_carried_ = std::move(carried);
  spill_changes_ = window_->changes();
}

void TraceSink::StopSpilling(const std::string& why) {
  if (!spilling_) return;
  spilling_ = false;
  std::fprintf(stderr,
               "torchrr: warning: --spill stopped: %s; the last steps are kept in memory only\n",
               why.c_str());
  EndSpill(/*remove=*/true);  // An older window than the run's would mislead after a kill.
}

void TraceSink::EndSpill(bool remove) {
  if (!spill_) return;
  // A file that does not close whole is kept all the same when it is to be kept (the trace at
  // `path` failed): its flushed chunks are then the only copy of the window, and read as a trace
  // cut short.
  (void)spill_->Close();
  spill_.reset();
  if (remove) ::unlink(spill_path_.c_str());
  spill_path_.clear();
  spill_carried_.clear();
}

bool TraceSink::IsSpillFile(int fd) const {
  if (spill_prefix_.empty()) return false;
  char target[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::string_view(target, n).starts_with(spill_prefix_);
}

}  // namespace torchrr::recorder
