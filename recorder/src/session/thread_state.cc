#include "session/thread_state.h"

namespace torchrr::recorder {

constinit thread_local ThreadState* t_state = nullptr;

namespace {

thread_local bool t_state_gone = false;  // The thread's state was deleted: it is exiting.

struct ThreadStateOwner {
  ~ThreadStateOwner() {
    t_state_gone = true;
    delete std::exchange(t_state, nullptr);
  }
};

}  // namespace

void OpFrame::Reset() {
  for (format::Value& value : op.values) {
    if (value.ints.capacity() != 0) spare_ints.push_back(std::move(value.ints));
  }
  ResetKeepingCapacity(op, &format::OpRecord::inputs, &format::OpRecord::outputs,
                       &format::OpRecord::values, &format::OpRecord::input_ranges,
                       &format::OpRecord::output_ranges);
  input_counters.clear();
  input_spans.clear();
  before.clear();
  uncaught_at_start = 0;
  sequence_at_start = sequence_at_end = thread = 0;
  exec_node = 0;
  exec_node_address = nullptr;
  session = 0;
  active = false;
  transparent = false;
  deferred = false;
  deferred_name = nullptr;
  folded = false;
}

[[gnu::noinline]] ThreadState* NewThreadState() {
  if (t_state_gone) return nullptr;
  static thread_local ThreadStateOwner owner;  // Deletes it at the thread's exit.
  (void)owner;
  t_state = new (std::nothrow) ThreadState();
  return t_state;
}

OpHandle::~OpHandle() {
  ThreadState* ts = t_state;
  if (ts == nullptr) return;  // The thread is exiting: the frame is freed.
  ts->EndDeferredWrapper(frame.get());
  try {
    // 64: deeper than ops nest in practice; a pool never holds more.
    if (ts->free_frames.size() < 64) ts->free_frames.push_back(std::move(frame));
  } catch (const std::bad_alloc&) {
    // The frame is freed instead.
  }
}

}  // namespace torchrr::recorder
