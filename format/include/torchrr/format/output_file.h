// The one way torchrr opens a file it writes: a trace (`record`, `redact`), a report page, an
// export, a reproducer script.
//
// Every output path may be the user's by mistake or a stranger's by design: a link planted at
// `-o` (which a plain open would follow, truncating its target or creating a file elsewhere), a
// FIFO (whose open for writing blocks until a reader comes), the program's own script
// (`record -o train.py -- python train.py`). So an output is opened only when it is a regular file
// or does not exist yet, never through a link, and an existing file is replaced only when it is
// empty or starts as what the writer itself writes (an earlier output of the same verb), unless
// the user said --force.
#ifndef TORCHRR_FORMAT_OUTPUT_FILE_H_
#define TORCHRR_FORMAT_OUTPUT_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <streambuf>
#include <string>
#include <string_view>

#include "torchrr/format/status.h"

namespace torchrr::format {

// What an output may replace.
struct OutputFileOptions {
  // The first bytes the writer writes: an existing file that starts with them is an earlier
  // output of the same kind, replaced without --force. Empty: only an empty file is.
  std::string_view own_prefix;
  // The refusal's words for a file that does not start so: "PATH <not_own>: not replaced".
  std::string_view not_own = "was not written by this torchrr verb";
  // --force: any regular file is replaced.
  bool replace_any_file = false;
};

// The end of the message for an existing file that is not the writer's own: a command line that
// has --force says so after it.
inline constexpr std::string_view kNotReplaced = ": not replaced";

// Opens `path` for writing, creating it (mode 0644) when `create`, and truncating it when
// `truncate` (only after every check has passed). Returns the descriptor (O_CLOEXEC, blocking).
// Errors, each with the path in the message:
//   kInvalidArgument: an empty path; anything but a regular file, "not a regular file (a FIFO)"
//     ("a symbolic link", "a directory", ...): a link is never followed (O_NOFOLLOW), a FIFO or
//     device never opened in a way that blocks (lstat first, O_NONBLOCK, fstat after); an
//     existing non-empty file that does not start with options.own_prefix unless
//     options.replace_any_file, the message ending with kNotReplaced.
//   kIoError: open, fstat or truncate failed (strerror).
// Thread-safe.
StatusOr<int> OpenOutputFile(const std::string& path, const OutputFileOptions& options,
                             bool create, bool truncate);

// Whether OpenOutputFile(path, options, create and truncate) would succeed now, for a command
// line that refuses a bad output before its work: the same errors, and kIoError when `path` does
// not exist and its directory cannot take a new file. Creates and changes nothing.
Status CheckOutputFile(const std::string& path, const OutputFileOptions& options);

// Writes all `size` bytes to `fd`, retrying after a signal (EINTR) and a short write.
// kIoError "path: write: strerror" when a write fails or writes nothing.
Status WriteAll(int fd, const void* data, size_t size, const std::string& path);
inline Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  return WriteAll(fd, bytes.data(), bytes.size(), path);
}

// A std::ostream's buffer over a descriptor OpenOutputFile returned, for a writer that streams
// (the Chrome trace export): 64 KiB at a time through WriteAll. It owns the descriptor.
// After the first failed write it drops what follows; Close says what failed.
class OutputFileBuffer : public std::streambuf {
 public:
  OutputFileBuffer(int fd, std::string path);
  ~OutputFileBuffer() override;  // Closes if the caller did not; errors are dropped.
  OutputFileBuffer(const OutputFileBuffer&) = delete;
  OutputFileBuffer& operator=(const OutputFileBuffer&) = delete;

  // Writes what is buffered and closes the descriptor: Ok, or the first write or close error.
  // Idempotent.
  Status Close();

 protected:
  int_type overflow(int_type c) override;
  int sync() override;

 private:
  bool Drain();

  int fd_;
  std::string path_;
  std::string buffer_;
  Status status_;
};

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_OUTPUT_FILE_H_
