// SIGTERM, SIGINT and SIGABRT while steps are kept: the window is written before the process dies.
#include "sink/trace_sink.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace torchrr::recorder {

namespace {

// The sink whose window a fatal signal writes; one at a time (the process's recording).
std::atomic<TraceSink*> g_window_sink{nullptr};
constexpr int kWindowSignals[] = {SIGTERM, SIGINT, SIGABRT};
struct sigaction g_previous_actions[3];
// How long a fatal signal waits for the window to be written before the process goes on dying.
constexpr int kDumpWaitMs = 10000;

}  // namespace

void TraceSink::StartWriterThread() {
  sigset_t window, previous;
  sigemptyset(&window);
  for (int signal : kWindowSignals) sigaddset(&window, signal);
  // A new thread starts with its creator's mask: blocked from its first instruction.
  pthread_sigmask(SIG_BLOCK, &window, &previous);
  thread_ = std::thread([this] { WriterLoop(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void TraceSink::OnFatalSignal(int signal) {
  const int saved_errno = errno;
  TraceSink* sink = g_window_sink.load();
  // On the writer thread itself (abort() there, or a signal sent to that thread alone), waiting
  // would only delay the end by kDumpWaitMs: nothing else writes the window.
  if (sink != nullptr && pthread_equal(pthread_self(), sink->thread_.native_handle())) {
    sink = nullptr;
  }
  if (sink != nullptr) sink = g_window_sink.exchange(nullptr);
  if (sink != nullptr) {
    sink->dump_requested_.store(true);
    const timespec tick{0, 10 * 1000 * 1000};
    for (int waited = 0; waited < kDumpWaitMs && !sink->dump_done_.load(); waited += 10) {
      nanosleep(&tick, nullptr);
    }
  }
  // The action the program had (the default: end the process), as if torchrr were not there.
  for (size_t i = 0; i < std::size(kWindowSignals); ++i) {
    if (kWindowSignals[i] == signal) sigaction(signal, &g_previous_actions[i], nullptr);
  }
  errno = saved_errno;
  raise(signal);
}

void TraceSink::InstallSignalHandlers() {
  TraceSink* expected = nullptr;
  if (!g_window_sink.compare_exchange_strong(expected, this)) return;  // Another sink has them.
  handlers_installed_ = true;
  for (size_t i = 0; i < std::size(kWindowSignals); ++i) {
    struct sigaction current {};
    if (sigaction(kWindowSignals[i], nullptr, &current) != 0) continue;
    g_previous_actions[i] = current;
    // Only where the signal would end the process with no handler of the program's (Python's
    // SIGINT handler raises KeyboardInterrupt, and the trace is closed at exit as usual).
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
      struct sigaction action {};
      action.sa_handler = &TraceSink::OnFatalSignal;
      sigemptyset(&action.sa_mask);
      sigaction(kWindowSignals[i], &action, nullptr);
    }
  }
}

void TraceSink::RestoreSignalHandlers() {
  if (!handlers_installed_) return;
  handlers_installed_ = false;
  TraceSink* self = this;
  g_window_sink.compare_exchange_strong(self, nullptr);
  for (size_t i = 0; i < std::size(kWindowSignals); ++i) {
    struct sigaction current {};
    if (sigaction(kWindowSignals[i], nullptr, &current) == 0 &&
        !(current.sa_flags & SA_SIGINFO) && current.sa_handler == &TraceSink::OnFatalSignal) {
      sigaction(kWindowSignals[i], &g_previous_actions[i], nullptr);
    }
  }
}

}  // namespace torchrr::recorder
