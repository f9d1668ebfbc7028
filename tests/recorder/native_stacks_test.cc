// CaptureNativeStack (recorder/src/stacks/native_stacks.cc): libunwind's fast path returns the frames
// Boost.Stacktrace (libgcc's unwinder) returns, at every depth, and keeps doing so past the
// captures it verifies. No torch.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <boost/stacktrace.hpp>
#include <gtest/gtest.h>

#include "stacks/libunwind_backtrace.h"
#include "stacks/native_stacks.h"

namespace torchrr::recorder {
namespace {

struct Captured {
  std::vector<uintptr_t> torchrr;
  std::vector<uintptr_t> boost;
};

// Both stacks from the same function: they differ only in frame 0 (two call sites in it).
__attribute__((noinline)) Captured CaptureBoth() {
  Captured c;
  uintptr_t pcs[kMaxNativeFrames];
  size_t n = CaptureNativeStack(pcs, kMaxNativeFrames, 0);
  c.torchrr.assign(pcs, pcs + n);
  void* frames[kMaxNativeFrames + 1];
  size_t m = boost::stacktrace::safe_dump_to(0, frames, sizeof(frames));
  for (size_t i = 0; i < m && frames[i] != nullptr; ++i) {
    c.boost.push_back(reinterpret_cast<uintptr_t>(frames[i]));
  }
  asm volatile("" ::: "memory");  // Not a tail call: CaptureBoth's frame stays on the stack.
  return c;
}

// `depth` more frames, each a different return address.
__attribute__((noinline)) Captured Descend(int depth) {
  Captured c = depth == 0 ? CaptureBoth() : Descend(depth - 1);
  asm volatile("" ::: "memory");
  return c;
}

TEST(NativeStacks, SameFramesAsBoostAtEveryDepth) {
  for (int round = 0; round < 3; ++round) {  // The first captures verify, later ones do not.
    for (int depth = 0; depth < 40; ++depth) {
      Captured c = Descend(depth);
      ASSERT_EQ(c.torchrr.size(), c.boost.size()) << "depth " << depth;
      ASSERT_GT(c.torchrr.size(), static_cast<size_t>(depth + 1));
      for (size_t i = 1; i < c.torchrr.size(); ++i) {
        ASSERT_EQ(c.torchrr[i], c.boost[i]) << "depth " << depth << ", frame " << i;
      }
    }
  }
}

TEST(NativeStacks, DeepStackIsCutAtMax) {
  Captured c = Descend(kMaxNativeFrames + 10);
  EXPECT_EQ(c.torchrr.size(), kMaxNativeFrames);
  uintptr_t pcs[8];
  EXPECT_EQ(CaptureNativeStack(pcs, 8, 0), 8u);
}

TEST(NativeStacks, LibunwindStaysTrustedOverManyCaptures) {
  if (LibunwindBacktrace() == nullptr) GTEST_SKIP() << "libunwind.so.8 is not installed";
  const char* forced = std::getenv("TORCHRR_NATIVE_UNWINDER");
  if (forced != nullptr && std::string(forced) == "boost") {
    GTEST_SKIP() << "TORCHRR_NATIVE_UNWINDER=boost";
  }
  // Past the first 64 and several one-in-1024 checks, from two call sites at many depths.
  for (int i = 0; i < 5000; ++i) Descend(i % 17);
  EXPECT_STREQ(NativeUnwinderName(), "libunwind");
}

TEST(NativeStacks, BoostWhenForced) {
  const char* forced = std::getenv("TORCHRR_NATIVE_UNWINDER");
  if (forced == nullptr || std::string(forced) != "boost") {
    GTEST_SKIP() << "run with TORCHRR_NATIVE_UNWINDER=boost (ctest does)";
  }
  Descend(3);
  EXPECT_STREQ(NativeUnwinderName(), "boost");
}

}  // namespace
}  // namespace torchrr::recorder
