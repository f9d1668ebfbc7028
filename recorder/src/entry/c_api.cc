#include "torchrr/c_api.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "options/environment_options.h"
#include "stacks/python_stacks.h"
#include "session/session.h"
#include "session/thread_state.h"
#include "capture/saved_fingerprints.h"
#include "torchrr/recording_options.h"

namespace {

std::mutex g_mu;
std::shared_ptr<torchrr::recorder::Session>* g_session = nullptr;  // Guarded by g_mu.

// A forked child stops its recording through torchrr_stop (at exit), which takes g_mu: the
// forking thread holds it across fork(), so that the child never finds it held by a thread it
// does not have. Registered after the session's own handlers, so that g_mu is taken before the
// session's lock, in the order Start() takes them.
void LockBeforeFork() { g_mu.lock(); }
void UnlockAfterFork() { g_mu.unlock(); }

// Starts the C API's one recording. Returns torchrr_start_with's 0 or 1.
int Start(const torchrr::RecorderOptions& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_session != nullptr && *g_session && (*g_session)->recording()) {
    std::fprintf(stderr, "torchrr: warning: not recording %s: already recording\n",
                 options.path.c_str());
    return 1;
  }
  std::string error;
  auto session = torchrr::recorder::Session::Start(options, &error);
  if (!session) {
    std::fprintf(stderr, "torchrr: warning: not recording: %s\n", error.c_str());
    return 1;
  }
  static const bool fork_handlers =
      pthread_atfork(&LockBeforeFork, &UnlockAfterFork, &UnlockAfterFork) == 0;
  (void)fork_handlers;  // Without them (ENOMEM), as before: a child may find g_mu held.
  if (g_session == nullptr) g_session = new std::shared_ptr<torchrr::recorder::Session>();
  *g_session = std::move(session);
  return 0;
}

// The RecorderOptions torchrr_start_with's `given` says, into *options. Returns why not ("" when
// they are understood).
std::string OptionsFromC(const torchrr_options* given, torchrr::RecorderOptions* options) {
  *options = torchrr::DefaultRecorderOptions(torchrr::recorder::PythonInterpreterRunning());
  if (given == nullptr) return "";
  if (given->path != nullptr) options->path = given->path;
  options->rank = given->rank;
  std::vector<const torchrr::RecordingOption*> named;
  for (size_t i = 0; i < given->setting_count; ++i) {
    const torchrr_setting& setting = given->settings[i];
    const std::string name = setting.name != nullptr ? setting.name : "";
    const std::string value = setting.value != nullptr ? setting.value : "";
    const torchrr::RecordingOption* option = torchrr::FindRecordingOptionByKeyword(name);
    if (option == nullptr) return "unknown option " + name;
    if (std::string why = option->set(torchrr::KeywordText(*option, value), options);
        !why.empty()) {
      return name + "=" + value + ": " + why;
    }
    named.push_back(option);
  }
  auto given_option = [&named](const torchrr::RecordingOption& option) {
    return std::find(named.begin(), named.end(), &option) != named.end();
  };
  if (const torchrr::RecordingOptionRelation* broken = torchrr::BrokenRelation(given_option)) {
    return std::string(broken->option->keyword) + (broken->needs ? " needs " : " excludes ") +
           broken->other->keyword;
  }
  return "";
}

// Says why `given` was refused where it asks; returns torchrr_start_with's 2.
int Refuse(const torchrr_options* given, const std::string& why) {
  if (given != nullptr && given->error != nullptr && given->error_size > 0) {
    std::snprintf(given->error, given->error_size, "%s", why.c_str());
  }
  return 2;
}

}  // namespace

extern "C" int torchrr_flush(void) {
  auto session = torchrr::recorder::Session::Active();
  return session && session->Flush() ? 0 : 1;
}

extern "C" void torchrr_step(void) {
  if (auto session = torchrr::recorder::Session::Active()) session->MarkStep();
}

extern "C" int torchrr_fingerprint(const void* data, size_t bytes, int device,
                                   uint64_t* fingerprint) {
  std::string error;
  if (fingerprint == nullptr ||
      !torchrr::recorder::FingerprintBytes(data, bytes, device, fingerprint, &error)) {
    return 1;
  }
  return 0;
}

extern "C" void torchrr_set_module(const char* module) {
  torchrr::recorder::ThreadState* ts = torchrr::recorder::ThisThread();
  if (ts == nullptr) return;
  auto session = torchrr::recorder::Session::Active();
  if (module == nullptr || *module == '\0' || !session) {
    ts->module.clear();
    return;
  }
  ts->module.assign(module);
  ts->module_session = session->serial();
}

extern "C" int torchrr_start_with(const torchrr_options* given) {
  torchrr::RecorderOptions options;
  if (std::string why = OptionsFromC(given, &options); !why.empty()) return Refuse(given, why);
  return Start(options);
}

extern "C" int torchrr_describe_options(const torchrr_options* given, char* out, size_t size) {
  torchrr::RecorderOptions options;
  if (std::string why = OptionsFromC(given, &options); !why.empty()) return Refuse(given, why);
  std::string text;
  for (const torchrr::RecordingOption& option : torchrr::RecordingOptions()) {
    text += std::string(option.keyword) + "=" + option.get(options) + "\n";
  }
  if (out != nullptr && size > 0) std::snprintf(out, size, "%s", text.c_str());
  return 0;
}

extern "C" int torchrr_start_from_environment(void) {
  // A preloaded library's constructor runs before the interpreter starts, so whether one runs
  // is asked now, not then. std::getenv: not safe against a concurrent setenv.
  std::optional<torchrr::RecorderOptions> options = torchrr::recorder::OptionsFromEnvironment(
      [](const char* name) { return std::getenv(name); },
      torchrr::recorder::PythonInterpreterRunning());
  return options ? Start(*options) : 1;
}

extern "C" int torchrr_stop(void) {
  std::shared_ptr<torchrr::recorder::Session> session;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_session == nullptr || !*g_session) return 1;
    session = std::move(*g_session);
  }
  session->Stop();
  return 0;
}

extern "C" int torchrr_recording(void) {
  auto session = torchrr::recorder::Session::Active();
  return session && session->recording() ? 1 : 0;
}

extern "C" void torchrr_record_error(int kind, const char* type, const char* message) {
  auto session = torchrr::recorder::Session::Active();
  if (!session) return;
  auto error_kind = kind == 1   ? torchrr::format::ErrorKind::kPythonException
                    : kind == 2 ? torchrr::format::ErrorKind::kUncaught
                                : torchrr::format::ErrorKind::kCppException;
  session->RecordError(error_kind, type ? type : "", message ? message : "");
}

extern "C" uint64_t torchrr_ops_recorded(void) {
  auto session = torchrr::recorder::Session::Active();
  return session ? session->ops_recorded() : 0;
}

extern "C" const char* torchrr_python_stack_walker(void) {
  return torchrr::recorder::PythonStackWalkerName();
}
