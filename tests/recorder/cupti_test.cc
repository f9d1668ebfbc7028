// CUDA kernel recording (recorder/src/cuda/cupti_tracer.cc) against a fake CUPTI, as libkineto tests
// its profiler with MockCuptiActivities: the fake hands the tracer buffers of the real CUPTI record
// structs (cupti_activity.h), built here the way CUPTI lays them out, and the test checks what
// reaches the Sink. No GPU, no torch.
//
// Built twice (tests/recorder/CMakeLists.txt): with cupti.h, and without it, where only the tests
// of the unavailable version are compiled.
#include "cuda/cupti_tracer.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#if TORCHRR_HAVE_CUPTI
#include <cupti.h>

#include "cuda/cupti_layouts.h"
#endif

namespace torchrr::recorder {
namespace {

using format::CudaCopyKind;
using format::CudaKernelRecord;
using format::CudaMemcpyRecord;

// What the tracer delivered.
class RecordingSink : public CudaActivityTracer::Sink {
 public:
  struct Kernel {
    CudaKernelRecord record;
    std::string name;
  };
  void OnKernel(const CudaKernelRecord& record, std::string_view name) override {
    kernels.push_back({record, std::string(name)});
  }
  void OnMemcpy(const CudaMemcpyRecord& record) override { copies.push_back(record); }
  void OnDataLoss(uint64_t records, std::string_view reason) override {
    losses.emplace_back(records, std::string(reason));
  }
  void OnDeliveryEnd() override { ++deliveries; }

  std::vector<Kernel> kernels;
  std::vector<CudaMemcpyRecord> copies;
  std::vector<std::pair<uint64_t, std::string>> losses;
  int deliveries = 0;
};

// The trace's clock in these tests: it stands still, so the offset is exact.
constexpr int64_t kTraceNow = 5'000'000'000;
constexpr uint64_t kCuptiNow = 1'000'000'000;
constexpr int64_t kOffset = kTraceNow - static_cast<int64_t>(kCuptiNow);
int64_t FixedClock() { return kTraceNow; }

// A fake CUPTI: plain functions over one state, as CUPTI's are plain C functions.
namespace fake {

struct State {
  std::set<int> enabled;
  int fail_enable_kind = -1;
  CuptiApi::Result fail_enable_result = 0;
  CuptiApi::Result flush_result = 0;
  std::vector<uint32_t> flush_flags;
  std::vector<std::pair<int, uint64_t>> pushes;
  int pops = 0;
  CuptiApi::BufferRequestedFn requested = nullptr;
  CuptiApi::BufferCompletedFn completed = nullptr;
  uint64_t timestamp = kCuptiNow;
  size_t dropped = 0;
  // Buffers "CUPTI" still holds: FlushAll completes them.
  std::vector<std::pair<uint8_t*, size_t>> held;
};
State state;

CuptiApi::Result GetVersion(uint32_t* version) {
  *version = 130001;
  return 0;
}
CuptiApi::Result GetResultString(CuptiApi::Result result, const char** text) {
  switch (result) {
    case 35: *text = "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"; return 0;
    case 999: *text = "CUPTI_ERROR_UNKNOWN"; return 0;
    default: return 3;  // CUPTI_ERROR_INVALID_PARAMETER
  }
}
CuptiApi::Result GetTimestamp(uint64_t* ns) {
  *ns = state.timestamp;
  return 0;
}
CuptiApi::Result Enable(int kind) {
  if (kind == state.fail_enable_kind) return state.fail_enable_result;
  state.enabled.insert(kind);
  return 0;
}
CuptiApi::Result Disable(int kind) {
  state.enabled.erase(kind);
  return 0;
}
CuptiApi::Result RegisterCallbacks(CuptiApi::BufferRequestedFn requested,
                                   CuptiApi::BufferCompletedFn completed) {
  state.requested = requested;
  state.completed = completed;
  return 0;
}
CuptiApi::Result FlushAll(uint32_t flag) {
  state.flush_flags.push_back(flag);
  if (state.flush_result != 0) return state.flush_result;
  auto held = std::move(state.held);
  state.held.clear();
  for (auto [buffer, used] : held) state.completed(nullptr, 0, buffer, 0, used);
  return 0;
}
CuptiApi::Result GetNumDroppedRecords(void*, uint32_t, size_t* dropped) {
  *dropped = state.dropped;
  return 0;
}
// CUPTI keeps one stack per thread; the fake records pushes and pops from every thread.
std::mutex ops_mu;
CuptiApi::Result Push(int kind, uint64_t id) {
  std::lock_guard<std::mutex> lock(ops_mu);
  state.pushes.emplace_back(kind, id);
  return 0;
}
CuptiApi::Result Pop(int, uint64_t*) {
  std::lock_guard<std::mutex> lock(ops_mu);
  ++state.pops;
  return 0;
}

#if TORCHRR_HAVE_CUPTI
// The size of each record kind the tests write; CUPTI knows its own.
size_t RecordSize(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return sizeof(CUpti_ActivityExternalCorrelation);
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: return sizeof(CUpti_ActivityAPI);
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(KernelActivity);
    case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(MemcpyActivity);
    case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(CUpti_ActivityMemset4);
    default: return 0;
  }
}

// Walks the records as cuptiActivityGetNextRecord does; a record of kind INVALID reads as CUPTI's
// "incomplete or invalid record".
CuptiApi::Result GetNextRecord(uint8_t* buffer, size_t valid_size, void** record) {
  size_t offset = 0;
  if (*record != nullptr) {
    auto* current = static_cast<CUpti_Activity*>(*record);
    offset = static_cast<size_t>(reinterpret_cast<uint8_t*>(current) - buffer) +
             RecordSize(current->kind);
  }
  if (offset >= valid_size) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  auto* next = reinterpret_cast<CUpti_Activity*>(buffer + offset);
  if (RecordSize(next->kind) == 0) return CUPTI_ERROR_INVALID_KIND;
  *record = next;
  return CUPTI_SUCCESS;
}
#else
CuptiApi::Result GetNextRecord(uint8_t*, size_t, void**) { return 12; }
#endif

CuptiApi Api() {
  CuptiApi api;
  api.GetVersion = GetVersion;
  api.GetResultString = GetResultString;
  api.GetTimestamp = GetTimestamp;
  api.ActivityEnable = Enable;
  api.ActivityDisable = Disable;
  api.ActivityRegisterCallbacks = RegisterCallbacks;
  api.ActivityFlushAll = FlushAll;
  api.ActivityGetNextRecord = GetNextRecord;
  api.ActivityGetNumDroppedRecords = GetNumDroppedRecords;
  api.ActivityPushExternalCorrelationId = Push;
  api.ActivityPopExternalCorrelationId = Pop;
  return api;
}

}  // namespace fake

#if TORCHRR_HAVE_CUPTI

// A buffer the tracer gave "CUPTI", filled with records the way CUPTI lays them out.
class Buffer {
 public:
  Buffer() { fake::state.requested(&data_, &size_, &max_records_); }
  ~Buffer() {
    if (data_ != nullptr) Complete();
  }
  template <typename Record>
  void Add(const Record& record) {
    ASSERT_LE(used_ + sizeof(Record), size_);
    std::memcpy(data_ + used_, &record, sizeof(Record));
    used_ += sizeof(Record);
  }
  // CUPTI hands it back full (the completion callback).
  void Complete() {
    uint8_t* data = std::exchange(data_, nullptr);
    fake::state.completed(nullptr, 0, data, size_, used_);
  }
  // CUPTI keeps it until the next flush.
  void Hold() { fake::state.held.emplace_back(std::exchange(data_, nullptr), used_); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  size_t max_records() const { return max_records_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t max_records_ = 1;
  size_t used_ = 0;
};

CUpti_ActivityExternalCorrelation External(uint32_t correlation, uint64_t op,
                                           CUpti_ExternalCorrelationKind kind =
                                               CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2) {
  CUpti_ActivityExternalCorrelation r{};
  r.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  r.externalKind = kind;
  r.externalId = op;
  r.correlationId = correlation;
  return r;
}

CUpti_ActivityAPI ApiCall(uint32_t correlation,
                          CUpti_ActivityKind kind = CUPTI_ACTIVITY_KIND_RUNTIME) {
  CUpti_ActivityAPI r{};
  r.kind = kind;
  r.correlationId = correlation;
  r.start = kCuptiNow + 1;
  r.end = kCuptiNow + 2;
  return r;
}

KernelActivity Kernel(uint32_t correlation, const char* name) {
  KernelActivity r{};
  r.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  r.correlationId = correlation;
  r.name = name;
  r.start = kCuptiNow + 100;
  r.end = kCuptiNow + 600;
  r.gridX = r.gridY = r.gridZ = 1;
  r.blockX = r.blockY = r.blockZ = 1;
  return r;
}

MemcpyActivity Memcpy(uint32_t correlation, CUpti_ActivityMemcpyKind kind, uint64_t bytes) {
  MemcpyActivity r{};
  r.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  r.copyKind = static_cast<uint8_t>(kind);
  r.bytes = bytes;
  r.correlationId = correlation;
  r.start = kCuptiNow + 1000;
  r.end = kCuptiNow + 3000;
  return r;
}

CUpti_ActivityMemset4 Memset(uint32_t correlation, uint32_t value, uint64_t bytes) {
  CUpti_ActivityMemset4 r{};
  r.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  r.value = value;
  r.bytes = bytes;
  r.correlationId = correlation;
  r.start = kCuptiNow + 5000;
  r.end = kCuptiNow + 5100;
  return r;
}

class CuptiTracer : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::state = fake::State();
    api_ = fake::Api();
    std::string why_not;
    tracer_ = CudaActivityTracer::Start(api_, &sink_, FixedClock, &why_not);
    ASSERT_NE(tracer_, nullptr) << why_not;
    ASSERT_NE(fake::state.requested, nullptr);
  }

  CuptiApi api_;
  RecordingSink sink_;
  std::unique_ptr<CudaActivityTracer> tracer_;
};

TEST_F(CuptiTracer, EnablesWhatExternalCorrelationNeedsAndMeasuresTheClockOffset) {
  // CUPTI emits external correlation records only for the API calls it records: RUNTIME and
  // DRIVER must be on too.
  EXPECT_EQ(fake::state.enabled,
            (std::set<int>{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                           CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME,
                           CUPTI_ACTIVITY_KIND_DRIVER,
                           CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION}));
  EXPECT_EQ(tracer_->clock_offset_ns(), kOffset);
  EXPECT_TRUE(tracer_->active());
}

TEST_F(CuptiTracer, GivesCuptiAlignedFourMiBBuffers) {
  Buffer buffer;
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), size_t{4} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 8, 0u);
  EXPECT_EQ(buffer.max_records(), 0u);  // As many as fit.
}

TEST_F(CuptiTracer, AttributesKernelsCopiesAndMemsetsToTheOpsThatLaunchedThem) {
  Buffer buffer;
  // Op 42 launches a kernel. libkineto's own correlation (CUSTOM0) for the same call is not ours.
  buffer.Add(External(7, 42));
  buffer.Add(External(7, 999, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0));
  buffer.Add(ApiCall(7));
  KernelActivity kernel = Kernel(7, "ampere_sgemm_128x64_nn");
  kernel.deviceId = 1;
  kernel.streamId = 7;
  kernel.gridX = 4;
  kernel.gridY = 2;
  kernel.gridZ = 3;
  kernel.blockX = 128;
  kernel.blockY = 2;
  kernel.blockZ = 1;
  kernel.staticSharedMemory = 1024;
  kernel.dynamicSharedMemory = 512;
  kernel.registersPerThread = 64;
  buffer.Add(kernel);
  // Op 43 copies to the device, then sets memory.
  buffer.Add(External(8, 43));
  buffer.Add(ApiCall(8));
  MemcpyActivity copy = Memcpy(8, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, 4096);
  copy.deviceId = 0;
  copy.streamId = 13;
  buffer.Add(copy);
  buffer.Add(External(9, 43));
  buffer.Add(ApiCall(9, CUPTI_ACTIVITY_KIND_DRIVER));
  buffer.Add(Memset(9, 0xab, 256));
  // A kernel launched outside any op: its API call came without an external correlation.
  buffer.Add(ApiCall(10));
  buffer.Add(Kernel(10, "outside_any_op"));
  buffer.Complete();

  ASSERT_EQ(sink_.kernels.size(), 2u);
  const CudaKernelRecord& k = sink_.kernels[0].record;
  EXPECT_EQ(sink_.kernels[0].name, "ampere_sgemm_128x64_nn");
  EXPECT_EQ(k.op, 42u);
  EXPECT_EQ(k.device, 1);
  EXPECT_EQ(k.stream, 7u);
  EXPECT_EQ(k.correlation, 7u);
  EXPECT_EQ(k.start_ns, kTraceNow + 100);  // CUPTI's clock moved onto the trace's.
  EXPECT_EQ(k.end_ns, kTraceNow + 600);
  EXPECT_EQ(k.grid.x, 4u);
  EXPECT_EQ(k.grid.y, 2u);
  EXPECT_EQ(k.grid.z, 3u);
  EXPECT_EQ(k.block.x, 128u);
  EXPECT_EQ(k.block.y, 2u);
  EXPECT_EQ(k.block.z, 1u);
  EXPECT_EQ(k.shared_memory, 1536u);  // Static and dynamic.
  EXPECT_EQ(k.registers, 64u);
  EXPECT_EQ(sink_.kernels[1].name, "outside_any_op");
  EXPECT_EQ(sink_.kernels[1].record.op, 0u);

  ASSERT_EQ(sink_.copies.size(), 2u);
  const CudaMemcpyRecord& c = sink_.copies[0];
  EXPECT_EQ(c.kind, CudaCopyKind::kHostToDevice);
  EXPECT_EQ(c.op, 43u);
  EXPECT_EQ(c.device, 0);
  EXPECT_EQ(c.stream, 13u);
  EXPECT_EQ(c.correlation, 8u);
  EXPECT_EQ(c.bytes, 4096u);
  EXPECT_EQ(c.start_ns, kTraceNow + 1000);
  EXPECT_EQ(c.end_ns, kTraceNow + 3000);
  const CudaMemcpyRecord& m = sink_.copies[1];
  EXPECT_EQ(m.kind, CudaCopyKind::kMemset);
  EXPECT_EQ(m.op, 43u);
  EXPECT_EQ(m.memset_value, 0xabu);
  EXPECT_EQ(m.bytes, 256u);
  EXPECT_EQ(m.start_ns, kTraceNow + 5000);

  EXPECT_EQ(sink_.deliveries, 1);  // One buffer, one delivery.
  EXPECT_TRUE(sink_.losses.empty());
}

TEST_F(CuptiTracer, CopyKindsAreMapped) {
  Buffer buffer;
  const std::pair<CUpti_ActivityMemcpyKind, CudaCopyKind> kinds[] = {
      {CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, CudaCopyKind::kHostToDevice},
      {CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, CudaCopyKind::kDeviceToHost},
      {CUPTI_ACTIVITY_MEMCPY_KIND_DTOD, CudaCopyKind::kDeviceToDevice},
      {CUPTI_ACTIVITY_MEMCPY_KIND_PTOP, CudaCopyKind::kPeer},
      {CUPTI_ACTIVITY_MEMCPY_KIND_HTOH, CudaCopyKind::kOther},
      {CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN, CudaCopyKind::kUnknown},
  };
  for (const auto& [cupti_kind, kind] : kinds) buffer.Add(Memcpy(0, cupti_kind, 1));
  buffer.Complete();
  ASSERT_EQ(sink_.copies.size(), std::size(kinds));
  for (size_t i = 0; i < std::size(kinds); ++i) {
    EXPECT_EQ(sink_.copies[i].kind, kinds[i].second) << "CUPTI copy kind " << kinds[i].first;
  }
}

TEST_F(CuptiTracer, CorrelationLaterInTheSameBufferStillAttributes) {
  Buffer buffer;
  buffer.Add(Kernel(30, "k"));
  buffer.Add(External(30, 5));
  buffer.Add(ApiCall(30));
  buffer.Complete();
  ASSERT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.kernels[0].record.op, 5u);
}

TEST_F(CuptiTracer, KernelWaitsForItsCorrelationInALaterBuffer) {
  // The name comes from memory that changes once the first buffer is read: the tracer must keep
  // its own copy while the kernel waits.
  std::string name = "late_kernel";
  {
    Buffer first;
    first.Add(Kernel(20, name.c_str()));
    first.Complete();
  }
  EXPECT_TRUE(sink_.kernels.empty());
  name.assign(name.size(), 'x');
  Buffer second;
  second.Add(External(20, 77));
  second.Add(ApiCall(20));
  second.Complete();
  ASSERT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.kernels[0].record.op, 77u);
  EXPECT_EQ(sink_.kernels[0].name, "late_kernel");
}

TEST_F(CuptiTracer, RecordWhoseLaunchNeverComesGoesOutWithOpZeroAfterAFewBuffers) {
  {
    Buffer buffer;
    buffer.Add(Memcpy(40, CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, 8));
    buffer.Complete();
  }
  for (int i = 1; i < CudaActivityTracer::kMaxPendingBuffers; ++i) {
    Buffer().Complete();
    EXPECT_TRUE(sink_.copies.empty()) << "after " << i << " more buffers";
  }
  Buffer().Complete();
  ASSERT_EQ(sink_.copies.size(), 1u);
  EXPECT_EQ(sink_.copies[0].op, 0u);
  EXPECT_EQ(sink_.copies[0].kind, CudaCopyKind::kDeviceToHost);
}

TEST_F(CuptiTracer, DeviceLaunchedKernelWithoutCorrelationGoesOutAtOnce) {
  Buffer buffer;
  buffer.Add(Kernel(0, "device_side"));
  buffer.Complete();
  ASSERT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.kernels[0].record.op, 0u);
}

TEST_F(CuptiTracer, StopFlushesThenDeliversEverythingStillWaiting) {
  {
    Buffer buffer;
    buffer.Add(Kernel(50, "never_correlated"));
    buffer.Complete();
  }
  // CUPTI still holds a buffer: the forced flush at Stop() hands it over.
  Buffer held;
  held.Add(External(51, 9));
  held.Add(ApiCall(51));
  held.Add(Memset(51, 0, 64));
  held.Hold();
  EXPECT_TRUE(sink_.kernels.empty());

  tracer_->Stop();
  EXPECT_EQ(fake::state.flush_flags, std::vector<uint32_t>{CUPTI_ACTIVITY_FLAG_FLUSH_FORCED});
  EXPECT_TRUE(fake::state.enabled.empty());
  EXPECT_FALSE(tracer_->active());
  ASSERT_EQ(sink_.copies.size(), 1u);
  EXPECT_EQ(sink_.copies[0].op, 9u);
  ASSERT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.kernels[0].record.op, 0u);
  EXPECT_EQ(sink_.kernels[0].name, "never_correlated");

  // Idempotent, and nothing more reaches the sink afterwards.
  int deliveries = sink_.deliveries;
  tracer_->Stop();
  Buffer late;
  late.Add(Kernel(0, "after_stop"));
  late.Complete();
  EXPECT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.deliveries, deliveries);
  EXPECT_EQ(fake::state.flush_flags.size(), 1u);
}

TEST_F(CuptiTracer, ZeroTimestampsMeanUntimedAndStayZero) {
  Buffer buffer;
  KernelActivity kernel = Kernel(0, "untimed");
  kernel.start = 0;
  kernel.end = 0;
  buffer.Add(kernel);
  buffer.Complete();
  ASSERT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.kernels[0].record.start_ns, 0);
  EXPECT_EQ(sink_.kernels[0].record.end_ns, 0);
}

TEST_F(CuptiTracer, FlushAsksForCompletedBuffersAndRemeasuresTheClock) {
  Buffer held;
  held.Add(Kernel(0, "k"));
  held.Hold();
  fake::state.timestamp = kCuptiNow + 250;  // CUPTI's clock drifted by 250 ns.
  tracer_->Flush();
  EXPECT_EQ(fake::state.flush_flags, std::vector<uint32_t>{0});
  EXPECT_EQ(tracer_->clock_offset_ns(), kOffset - 250);
  ASSERT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.kernels[0].record.start_ns, kTraceNow + 100 - 250);
}

TEST_F(CuptiTracer, DroppedRecordsBecomeADataLoss) {
  fake::state.dropped = 5;
  Buffer().Complete();
  ASSERT_EQ(sink_.losses.size(), 1u);
  EXPECT_EQ(sink_.losses[0].first, 5u);
  EXPECT_NE(sink_.losses[0].second.find("CUPTI dropped"), std::string::npos);
  EXPECT_EQ(sink_.deliveries, 1);
}

TEST_F(CuptiTracer, UnreadableRecordEndsItsBufferAndIsCountedAsLost) {
  Buffer buffer;
  buffer.Add(External(60, 1));
  buffer.Add(ApiCall(60));
  buffer.Add(Kernel(60, "before"));
  CUpti_Activity invalid{};
  invalid.kind = CUPTI_ACTIVITY_KIND_INVALID;
  buffer.Add(invalid);
  buffer.Add(Kernel(0, "after"));
  buffer.Complete();
  ASSERT_EQ(sink_.kernels.size(), 1u);
  EXPECT_EQ(sink_.kernels[0].name, "before");
  EXPECT_EQ(sink_.kernels[0].record.op, 1u);
  ASSERT_EQ(sink_.losses.size(), 1u);
  EXPECT_TRUE(tracer_->active());  // CUPTI's documented answer, not a failure.
}

TEST_F(CuptiTracer, PushesTheOpAroundItAndPopsOnlyWhatItPushed) {
  tracer_->PushOp(5);
  tracer_->PushOp(6);  // A nested op: innermost wins.
  tracer_->PopOp();
  tracer_->PopOp();
  tracer_->PopOp();  // One end too many (an op whose start was not seen): not popped.
  EXPECT_EQ(fake::state.pushes,
            (std::vector<std::pair<int, uint64_t>>{{CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, 5},
                                                   {CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, 6}}));
  EXPECT_EQ(fake::state.pops, 2);
}

TEST_F(CuptiTracer, OpsStillRunningAtStopArePoppedAndNothingNewIsPushed) {
  tracer_->PushOp(1);
  tracer_->Stop();
  tracer_->PushOp(2);  // After Stop(): nothing pushed...
  tracer_->PopOp();
  tracer_->PopOp();
  // ...and CUPTI's stack for this thread ends as it began: the one push popped, once.
  EXPECT_EQ(fake::state.pushes.size(), 1u);
  EXPECT_EQ(fake::state.pops, 1);
}

TEST_F(CuptiTracer, PushesAnEarlierTracerLeftOnAThreadArePoppedAtItsNextPush) {
  tracer_->PushOp(1);  // An op whose end never comes (the recording stopped inside it).
  tracer_.reset();
  std::string why_not;
  auto next = CudaActivityTracer::Start(api_, &sink_, FixedClock, &why_not);
  ASSERT_NE(next, nullptr) << why_not;
  fake::state.pops = 0;
  next->PushOp(2);
  EXPECT_EQ(fake::state.pops, 1);
  EXPECT_EQ(fake::state.pushes.back().second, 2u);
  next->PopOp();
  EXPECT_EQ(fake::state.pops, 2);
}

TEST_F(CuptiTracer, OnlyOneTracerAtATime) {
  RecordingSink other;
  std::string why_not;
  EXPECT_EQ(CudaActivityTracer::Start(api_, &other, FixedClock, &why_not), nullptr);
  EXPECT_NE(why_not.find("another"), std::string::npos) << why_not;
  // The refused start left the running tracer whole.
  Buffer buffer;
  buffer.Add(Kernel(0, "k"));
  buffer.Complete();
  EXPECT_EQ(sink_.kernels.size(), 1u);
  EXPECT_TRUE(other.kernels.empty());
  EXPECT_EQ(fake::state.enabled.size(), 6u);
}

TEST_F(CuptiTracer, FailingCallWarnsOnceAndStopsTheTracer) {
  fake::state.flush_result = 999;
  ::testing::internal::CaptureStderr();
  tracer_->Flush();
  tracer_->Flush();
  tracer_->PushOp(3);
  tracer_->Stop();  // Its flush fails too: no second warning.
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("torchrr: warning: "), std::string::npos) << err;
  EXPECT_NE(err.find("cuptiActivityFlushAll failed: CUPTI_ERROR_UNKNOWN (999)"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("torchrr: warning: "), err.rfind("torchrr: warning: ")) << err;
  EXPECT_FALSE(tracer_->active());
  EXPECT_TRUE(fake::state.enabled.empty());  // Stopped collecting.
  EXPECT_TRUE(fake::state.pushes.empty());
}

TEST_F(CuptiTracer, OpsOnManyThreadsWhileCuptiDeliversBuffers) {
  // Training threads push and pop while CUPTI's thread hands back buffers; then Stop() from yet
  // another. Meant to be run under ThreadSanitizer too.
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 2000;
  constexpr int kBuffers = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kOpsPerThread; ++i) {
        tracer_->PushOp(static_cast<uint64_t>(t) * kOpsPerThread + i + 1);
        tracer_->PopOp();
      }
    });
  }
  std::thread cupti([] {
    for (int b = 0; b < kBuffers; ++b) {
      Buffer buffer;
      uint32_t correlation = static_cast<uint32_t>(b) + 1;
      buffer.Add(External(correlation, correlation));
      buffer.Add(ApiCall(correlation));
      buffer.Add(Kernel(correlation, "k"));
      buffer.Complete();
    }
  });
  for (auto& thread : threads) thread.join();
  cupti.join();
  std::thread([this] { tracer_->Stop(); }).join();
  EXPECT_EQ(fake::state.pushes.size(), size_t{kThreads} * kOpsPerThread);
  EXPECT_EQ(fake::state.pops, kThreads * kOpsPerThread);
  ASSERT_EQ(sink_.kernels.size(), size_t{kBuffers});
  for (const auto& kernel : sink_.kernels) EXPECT_EQ(kernel.record.op, kernel.record.correlation);
}

class CuptiStart : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::state = fake::State();
    api_ = fake::Api();
  }
  CuptiApi api_;
  RecordingSink sink_;
};

TEST_F(CuptiStart, RefusalBecomesAClearReasonAndLeavesNothingEnabled) {
  fake::state.fail_enable_kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  fake::state.fail_enable_result = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  std::string why_not;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(CudaActivityTracer::Start(api_, &sink_, FixedClock, &why_not), nullptr);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // The caller warns, once.
  EXPECT_NE(why_not.find("cuptiActivityEnable(CONCURRENT_KERNEL) failed: "
                         "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES (35)"),
            std::string::npos)
      << why_not;
  EXPECT_TRUE(fake::state.enabled.empty());

  // A refusal after some kinds were enabled disables them again.
  fake::state.fail_enable_kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  fake::state.fail_enable_result = 999;
  EXPECT_EQ(CudaActivityTracer::Start(api_, &sink_, FixedClock, &why_not), nullptr);
  EXPECT_NE(why_not.find("EXTERNAL_CORRELATION"), std::string::npos) << why_not;
  EXPECT_TRUE(fake::state.enabled.empty());
  EXPECT_TRUE(fake::state.flush_flags.empty());

  // Nothing of the refused starts stays behind.
  fake::state.fail_enable_kind = -1;
  auto tracer = CudaActivityTracer::Start(api_, &sink_, FixedClock, &why_not);
  EXPECT_NE(tracer, nullptr) << why_not;
}

TEST_F(CuptiStart, MissingFunctionIsNamed) {
  api_.ActivityPushExternalCorrelationId = nullptr;
  std::string why_not;
  EXPECT_EQ(CudaActivityTracer::Start(api_, &sink_, FixedClock, &why_not), nullptr);
  EXPECT_NE(why_not.find("cuptiActivityPushExternalCorrelationId"), std::string::npos) << why_not;
}

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The real libcupti of this machine, whatever it is: no libcupti, no driver (no GPU), or a GPU.
// Whatever happens, it must not crash, and a refusal must say why.
TEST(CuptiReal, LoaderAndStartFailCleanlyOrWork) {
  CuptiApi api;
  std::string why_not;
  if (!LoadCupti(&api, &why_not)) {
    EXPECT_FALSE(why_not.empty());
    std::printf("no libcupti: %s\n", why_not.c_str());
    return;
  }
  RecordingSink sink;
  auto tracer = CudaActivityTracer::Start(api, &sink, SteadyNowNs, &why_not);
  if (tracer == nullptr) {
    EXPECT_FALSE(why_not.empty());
    std::printf("libcupti loaded, tracing refused: %s\n", why_not.c_str());
    return;
  }
  std::printf("tracing with the real CUPTI (clock offset %lld ns)\n",
              static_cast<long long>(tracer->clock_offset_ns()));
  tracer->PushOp(1);
  tracer->PopOp();
  tracer->Flush();
  tracer->Stop();
}

#else  // !TORCHRR_HAVE_CUPTI

TEST(CuptiUnavailable, StartAndLoaderSayUnavailable) {
  CuptiApi api = fake::Api();
  RecordingSink sink;
  std::string why_not;
  EXPECT_EQ(CudaActivityTracer::Start(api, &sink, FixedClock, &why_not), nullptr);
  EXPECT_NE(why_not.find("unavailable"), std::string::npos) << why_not;
  EXPECT_TRUE(fake::state.enabled.empty());
  why_not.clear();
  EXPECT_FALSE(LoadCupti(&api, &why_not));
  EXPECT_NE(why_not.find("unavailable"), std::string::npos) << why_not;
}

#endif  // TORCHRR_HAVE_CUPTI

}  // namespace
}  // namespace torchrr::recorder
