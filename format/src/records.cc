#include "torchrr/format/records.h"

#include <array>

namespace torchrr::format {
namespace {

// In Record's alternative order.
constexpr std::array<const char*, kRecordKindCount> kKindNames = {
    "string", "frame", "stack", "tensor", "op", "node", "node_exec", "error", "cuda_kernel",
    "cuda_memcpy", "data_loss", "fingerprint", "source_file", "source_lines",
    "step",
};

}  // namespace

const char* RecordKindName(const Record& record) { return RecordKindNameAt(record.index()); }

const char* RecordKindNameAt(size_t index) {
  return index < kKindNames.size() ? kKindNames[index] : "unknown";
}

}  // namespace torchrr::format
