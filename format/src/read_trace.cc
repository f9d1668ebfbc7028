// A whole trace read through TraceParser: a file, in blocks, or bytes in memory.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <vector>

#include "torchrr/format/reader.h"

namespace torchrr::format {

uint64_t ReadSummary::records() const {
  return std::accumulate(records_per_kind.begin(), records_per_kind.end(), uint64_t{0});
}

ReadSummary ReadTraceFile(const std::string& path, const RecordCallback& on_record) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ReadSummary summary;
    summary.status = Status(StatusCode::kNotATrace, std::strerror(errno));
    summary.warnings.push_back(summary.status.message());
    return summary;
  }
  TraceParser parser(on_record);
  std::vector<char> buf(1u << 20);
  int read_errno = 0;
  bool read_any = false;
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      read_errno = errno;
      break;
    }
    if (n == 0) break;
    read_any = true;
    if (!parser.Feed(buf.data(), static_cast<size_t>(n))) break;
  }
  struct stat st {};
  bool have_size = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  ReadSummary summary = parser.Finish();
  if (have_size) summary.file_size = static_cast<uint64_t>(st.st_size);
  if (read_errno != 0 && !read_any) {
    summary.status = Status(StatusCode::kNotATrace, std::strerror(read_errno));
    summary.warnings.assign(1, summary.status.message());
  } else if (read_errno != 0) {
    summary.warnings.push_back(std::string("read: ") + std::strerror(read_errno));
    if (static_cast<int>(summary.status.code()) < static_cast<int>(StatusCode::kIoError)) {
      summary.status =
          Status(StatusCode::kIoError, std::string("read: ") + std::strerror(read_errno));
    }
  }
  return summary;
}

ReadSummary ReadTraceBytes(std::string_view bytes, const RecordCallback& on_record) {
  TraceParser parser(on_record);
  parser.Feed(bytes.data(), bytes.size());
  return parser.Finish();
}

Trace ReadTraceFileAll(const std::string& path) {
  Trace trace;
  trace.summary = ReadTraceFile(path, [&](const Record& r) { trace.records.push_back(r); });
  return trace;
}

Trace ReadTraceBytesAll(std::string_view bytes) {
  Trace trace;
  trace.summary = ReadTraceBytes(bytes, [&](const Record& r) { trace.records.push_back(r); });
  return trace;
}

}  // namespace torchrr::format
