#include "memory_limit.h"

#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#include "torchrr/format/trace_size.h"

namespace torchrr::cli {
namespace {

std::atomic<uint64_t> g_limit{0};
std::atomic<uint64_t> g_live{0};
std::atomic<uint64_t> g_peak{0};

// Counts `p` (just allocated) in; frees it and returns nullptr when that passes the limit.
void* Counted(void* p) {
  if (p == nullptr) return nullptr;
  const uint64_t size = malloc_usable_size(p);
  const uint64_t live = g_live.fetch_add(size, std::memory_order_relaxed) + size;
  const uint64_t limit = g_limit.load(std::memory_order_relaxed);
  if (limit != 0 && live > limit) {
    g_live.fetch_sub(size, std::memory_order_relaxed);
    std::free(p);
    return nullptr;
  }
  uint64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  return p;
}

void* Allocate(size_t size, size_t alignment) {
  if (size == 0) size = 1;
  void* p = nullptr;
  if (alignment <= alignof(std::max_align_t)) {
    p = std::malloc(size);
  } else if (::posix_memalign(&p, alignment, size) != 0) {
    p = nullptr;
  }
  return Counted(p);
}

void Release(void* p) {
  if (p == nullptr) return;
  g_live.fetch_sub(malloc_usable_size(p), std::memory_order_relaxed);
  std::free(p);
}

}  // namespace

uint64_t MemoryLimitFor(const std::vector<std::string>& traces) {
  uint64_t decompressed = 0;
  for (const std::string& trace : traces) decompressed += format::DecompressedTraceBytes(trace);
  return kMemoryPerTraceByte * decompressed + kMemoryBaseBytes;
}

void SetMemoryLimit(uint64_t bytes) { g_limit.store(bytes, std::memory_order_relaxed); }
uint64_t MemoryLimit() { return g_limit.load(std::memory_order_relaxed); }
uint64_t PeakHeapBytes() { return g_peak.load(std::memory_order_relaxed); }

bool ParseByteSize(const std::string& text, uint64_t* bytes) {
  if (text.empty()) return false;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || text[0] == '-') return false;
  int shift = 0;
  switch (*end) {
    case '\0': break;
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    default: return false;
  }
  if (*end != '\0' && end[1] != '\0') return false;
  if (shift != 0 && n > (UINT64_MAX >> shift)) return false;
  *bytes = static_cast<uint64_t>(n) << shift;
  return true;
}

}  // namespace torchrr::cli

// The replaceable global allocation functions ([new.delete]): every form counts through
// Allocate/Release.
using torchrr::cli::Allocate;
using torchrr::cli::Release;

void* operator new(size_t size) {
  if (void* p = Allocate(size, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t size) { return operator new(size); }
void* operator new(size_t size, const std::nothrow_t&) noexcept { return Allocate(size, 0); }
void* operator new[](size_t size, const std::nothrow_t&) noexcept { return Allocate(size, 0); }
void* operator new(size_t size, std::align_val_t alignment) {
  if (void* p = Allocate(size, static_cast<size_t>(alignment))) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t size, std::align_val_t alignment) {
  return operator new(size, alignment);
}
void* operator new(size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return Allocate(size, static_cast<size_t>(alignment));
}
void* operator new[](size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return Allocate(size, static_cast<size_t>(alignment));
}
void operator delete(void* p) noexcept { Release(p); }
void operator delete[](void* p) noexcept { Release(p); }
void operator delete(void* p, size_t) noexcept { Release(p); }
void operator delete[](void* p, size_t) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { Release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { Release(p); }
