#include "torchrr/replayer/graphviz.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

#include "torchrr/replayer/printable.h"

extern char** environ;

namespace torchrr::replayer {
namespace {

// What one drawing may take: dot's time to lay a graph out grows much faster than the graph, and
// a trace is untrusted input. A graph kAutogradGraph draws takes well under a second.
constexpr auto kDotTime = std::chrono::seconds(20);
constexpr rlim_t kDotAddressSpace = rlim_t{2} << 30;
constexpr size_t kMaxSvgBytes = size_t{16} << 20;

// Writes all of `data` to `fd` while reading `from` into `out`, so that neither side blocks on a
// full pipe; closes both. False when it took past `deadline` or the output grew past
// kMaxSvgBytes (the caller then kills dot).
bool Exchange(int to, const std::string& data, int from, std::string* out,
              std::chrono::steady_clock::time_point deadline) {
  size_t written = 0;
  char buf[1 << 16];
  bool from_open = true;
  bool in_time = true;
  while (from_open) {
    pollfd fds[2] = {{from, POLLIN, 0}, {written < data.size() ? to : -1, POLLOUT, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || out->size() > kMaxSvgBytes) {
      in_time = false;
      break;
    }
    if (poll(fds, 2, static_cast<int>(left.count())) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
      ssize_t n = write(to, data.data() + written, data.size() - written);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 && errno != EINTR && errno != EAGAIN) written = data.size();  // dot went away.
      if (written == data.size()) close(to);
    }
    if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
      ssize_t n = read(from, buf, sizeof(buf));
      if (n > 0) {
        out->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        from_open = false;
      }
    }
  }
  if (written < data.size()) close(to);
  close(from);
  return in_time;
}

}  // namespace

std::string DotEscape(const std::string& text) {
  // Printable's escapes are DOT's: \n a line break, \" a quote, \\ a backslash; and a string from
  // the trace can then hold neither a raw control character nor bytes that are not UTF-8.
  return replayer::Printable(text, '"');
}

format::StatusOr<std::string> DotToSvg(const std::string& graph) {
  using format::Status;
  using format::StatusCode;
  signal(SIGPIPE, SIG_IGN);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return Status(StatusCode::kIoError, strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return Status(StatusCode::kIoError, strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  // dot's warnings are its own business: the report says when the graph is missing.
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  char arg0[] = "dot", arg1[] = "-Tsvg";
  char* argv[] = {arg0, arg1, nullptr};
  pid_t pid = 0;
  int spawned = posix_spawnp(&pid, "dot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (spawned != 0) {
    close(in[1]);
    close(out[0]);
    return Status(StatusCode::kIoError, "dot not found (install graphviz)");
  }
  // Bounded memory, set as soon as dot exists (before it has read its input).
  const struct rlimit memory = {kDotAddressSpace, kDotAddressSpace};
  prlimit(pid, RLIMIT_AS, &memory, nullptr);
  std::string svg;
  const bool finished =
      Exchange(in[1], graph, out[0], &svg, std::chrono::steady_clock::now() + kDotTime);
  if (!finished) kill(pid, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 127) {
    return Status(StatusCode::kIoError, "dot not found (install graphviz)");
  }
  if (!finished) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("dot took over {} s or wrote over {} MiB: not drawn",
                              kDotTime.count(), kMaxSvgBytes >> 20));
  }
  size_t start = svg.find("<svg");
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0 || start == std::string::npos) {
    return Status(StatusCode::kInvalidArgument, "dot could not draw the graph");
  }
  return svg.substr(start);
}

}  // namespace torchrr::replayer
