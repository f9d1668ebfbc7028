// The trace format's version, declared once: what the writer puts in the file header, what the
// reader accepts, and what format/SPEC.md states (tests/format/spec_version_test.cc holds SPEC.md's
// header table, its "Current version" line, its version log and the golden files to these).
//
// Major: breaking. Minor: additive (SPEC.md, "Evolution"). The oldest reader is the oldest version
// that decodes a file correctly: 1.0 for a file written without step coding, the step coding's
// own version for one written with it (an older reader would decode its coded times and ids wrong).
// Never tied to torchrr's program version.
#ifndef TORCHRR_FORMAT_VERSION_H_
#define TORCHRR_FORMAT_VERSION_H_

#include <cstdint>

namespace torchrr::format {

inline constexpr uint16_t kFormatMajor = 1;
inline constexpr uint16_t kFormatMinor = 16;

inline constexpr uint16_t kOldestReaderMajor = 1;
// A file written without step coding reads with every 1.x reader.
inline constexpr uint16_t kOldestReaderMinor = 0;
// The version that introduced the step coding the writer uses now (RecordBatch.coding 5): 1.10 to
// 1.14 readers would refuse its batches as corrupt, or decode them wrong.
inline constexpr uint16_t kOldestStepCodingReaderMinor = 15;

}  // namespace torchrr::format

#endif  // TORCHRR_FORMAT_VERSION_H_
