#include "launch/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "exit_codes.h"

namespace torchrr::cli {
namespace {

pid_t g_child = 0;

// SIGTERM or SIGHUP: forwarded to the program when a process sent it (si_code SI_USER, SI_QUEUE,
// SI_TKILL: all <= 0), not when the kernel sent it to the whole foreground group.
void ForwardSignal(int signal_number, siginfo_t* info, void*) {
  if (g_child > 0 && info != nullptr && info->si_code <= 0) kill(g_child, signal_number);
}

// The dispositions RunRecord changes while it waits, to put back in the child before exec.
struct SavedSignals {
  struct sigaction interrupt, quit, terminate, hangup;
};

// Ignores SIGINT and SIGQUIT, forwards SIGTERM and SIGHUP; returns what was there.
SavedSignals TakeSignalsWhileWaiting() {
  SavedSignals saved;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGINT, &ignore, &saved.interrupt);
  sigaction(SIGQUIT, &ignore, &saved.quit);
  struct sigaction forward {};
  forward.sa_sigaction = ForwardSignal;
  forward.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGTERM, &forward, &saved.terminate);
  sigaction(SIGHUP, &forward, &saved.hangup);
  return saved;
}

void RestoreSignals(const SavedSignals& saved) {
  sigaction(SIGINT, &saved.interrupt, nullptr);
  sigaction(SIGQUIT, &saved.quit, nullptr);
  sigaction(SIGTERM, &saved.terminate, nullptr);
  sigaction(SIGHUP, &saved.hangup, nullptr);
}

}  // namespace

int RunProgram(const std::vector<std::string>& command, const std::function<void()>& prepare) {
  std::fflush(nullptr);
  // Taken before fork, so that no Ctrl-C between fork and exec reaches this process alone; the
  // child puts them back (an ignored SIGINT would survive exec, and Python would then never
  // raise KeyboardInterrupt).
  const SavedSignals saved = TakeSignalsWhileWaiting();
  // SIGTERM and SIGHUP wait until g_child is set, so that none is lost between fork and then.
  sigset_t forwarded, old_mask;
  sigemptyset(&forwarded);
  sigaddset(&forwarded, SIGTERM);
  sigaddset(&forwarded, SIGHUP);
  sigprocmask(SIG_BLOCK, &forwarded, &old_mask);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    RestoreSignals(saved);
    std::fprintf(stderr, "torchrr: error: fork: %s\n", std::strerror(errno));
    return kExitOther;
  }
  if (pid == 0) {
    RestoreSignals(saved);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    // When `torchrr record` dies without forwarding anything (SIGKILL, the OOM killer), the
    // program gets SIGTERM instead of training on, orphaned, with no one to pass its exit status
    // on; it survives the exec. A parent already gone before the prctl: the same, at once.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) raise(SIGTERM);
    prepare();
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "torchrr: error: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(kExitNotRun);
  }
  g_child = pid;
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::fprintf(stderr, "torchrr: error: waitpid: %s\n", std::strerror(errno));
      return kExitOther;
    }
  }
  g_child = 0;
  RestoreSignals(saved);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitOther;
}

}  // namespace torchrr::cli
