// The bound on the memory a verb that reads a trace may use: a multiple of the trace's
// decompressed size plus a constant (docs/reliability.md), so that a hostile trace (a long name
// named by every record, ids that make an index grow) ends with one line and kExitMemory instead
// of taking the machine's memory.
//
// The command line replaces the global operator new: every C++ allocation of the process counts
// its bytes (malloc_usable_size), and one that would take the live total past the limit throws
// std::bad_alloc, which main turns into the error line. Only this process counts: a program
// `record` or `fix --check` runs and Graphviz's dot are children with their own memory. C
// allocations (zstd's contexts, a few KiB) are not counted.
#ifndef TORCHRR_REPLAYER_CLI_MEMORY_LIMIT_H_
#define TORCHRR_REPLAYER_CLI_MEMORY_LIMIT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace torchrr::cli {

// The bound: kMemoryPerTraceByte times the decompressed bytes of the traces, plus
// kMemoryBaseBytes. Measured in docs/reliability.md ("Memory").
inline constexpr uint64_t kMemoryPerTraceByte = 16;
inline constexpr uint64_t kMemoryBaseBytes = 1ull << 30;  // 1 GiB.

// The bound for a verb reading `traces`: the decompressed bytes of all of them (a replay of
// several ranks keeps one report at a time, but the sum is simple and safe).
uint64_t MemoryLimitFor(const std::vector<std::string>& traces);

// From now on, an allocation that takes the live C++ heap past `bytes` fails (0: no limit).
// Thread-safe.
void SetMemoryLimit(uint64_t bytes);
uint64_t MemoryLimit();

// The most live C++ heap bytes the process has held, for tests and benchmarks.
uint64_t PeakHeapBytes();

// "--max-memory" values: a number of bytes with an optional K, M, G or T (powers of 1024) suffix.
// Returns false when `text` is not one.
bool ParseByteSize(const std::string& text, uint64_t* bytes);

}  // namespace torchrr::cli

#endif  // TORCHRR_REPLAYER_CLI_MEMORY_LIMIT_H_
