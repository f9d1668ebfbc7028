#include "torchrr/replayer/graphviz.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "torchrr/replayer/printable.h"

extern char** environ;

namespace torchrr::replayer {
namespace {

// Writes all of `data` to `fd` while reading `from` into `out`, so that neither side blocks on a
// full pipe; closes both.
bool Exchange(int to, const std::string& data, int from, std::string* out) {
  size_t written = 0;
  char buf[1 << 16];
  bool from_open = true;
  while (from_open) {
    pollfd fds[2] = {{from, POLLIN, 0}, {written < data.size() ? to : -1, POLLOUT, 0}};
    if (poll(fds, 2, -1) < 0) {
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
  return true;
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
  std::string svg;
  Exchange(in[1], graph, out[0], &svg);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 127) {
    return Status(StatusCode::kIoError, "dot not found (install graphviz)");
  }
  size_t start = svg.find("<svg");
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0 || start == std::string::npos) {
    return Status(StatusCode::kInvalidArgument, "dot could not draw the graph");
  }
  return svg.substr(start);
}

}  // namespace torchrr::replayer
