// The public Recorder: a thin owner of a Session.
#include "torchrr/recorder.h"

#include <cstdio>

#include "session/session.h"

namespace torchrr {

class Recorder::Impl {
 public:
  std::shared_ptr<recorder::Session> session;
};

Recorder::Recorder(RecorderOptions options) : impl_(std::make_unique<Impl>()) {
  std::string error;
  impl_->session = recorder::Session::Start(options, &error);
  if (!impl_->session) {
    std::fprintf(stderr, "torchrr: warning: not recording: %s\n", error.c_str());
  }
}

Recorder::~Recorder() { Stop(); }

void Recorder::Stop() {
  if (impl_->session) impl_->session->Stop();
}

bool Recorder::recording() const { return impl_->session && impl_->session->recording(); }

void Recorder::RecordError(const std::string& type, const std::string& message) {
  if (impl_->session) {
    impl_->session->RecordError(format::ErrorKind::kCppException, type, message);
  }
}

void Recorder::Step() {
  if (impl_->session) impl_->session->MarkStep();
}

bool Recorder::Flush() { return impl_->session && impl_->session->Flush(); }

uint64_t Recorder::ops_recorded() const {
  return impl_->session ? impl_->session->ops_recorded() : 0;
}

uint64_t Recorder::records_dropped() const {
  return impl_->session ? impl_->session->records_dropped() : 0;
}

}  // namespace torchrr
