// libFuzzer target for the trace reader: any input must parse without crashing, hanging or
// allocating without bound, and give the same result whatever the size of the pieces it is fed in.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "torchrr/format/json.h"
#include "torchrr/format/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace torchrr::format;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  uint64_t whole_records = 0;
  ReadSummary whole = ReadTraceBytes(bytes, [&](const Record& record) {
    ++whole_records;
    (void)RecordToJson(record);  // Every decoded value must be printable.
  });

  size_t piece = size == 0 ? 1 : data[size - 1] % 61 + 1;
  uint64_t piece_records = 0;
  TraceParser parser([&](const Record&) { ++piece_records; });
  for (size_t at = 0; at < size; at += piece) {
    if (!parser.Feed(data + at, size - at < piece ? size - at : piece)) break;
  }
  ReadSummary pieces = parser.Finish();
  if (pieces.status.code() != whole.status.code() || piece_records != whole_records ||
      pieces.chunks.size() != whole.chunks.size()) {
    __builtin_trap();  // The result depends on how the input was cut into pieces.
  }
  return 0;
}
