// Traces as a stranger could craft them, for the reader's tests and the golden bad files
// (tests/golden/make_golden.cc): each takes or makes the bytes of a whole file.
#ifndef TORCHRR_TESTS_FORMAT_HOSTILE_TRACES_H_
#define TORCHRR_TESTS_FORMAT_HOSTILE_TRACES_H_

#include <cstddef>
#include <string>
#include <vector>

namespace torchrr::format::testing {

// A file header, then chunk headers back to back up to `size` bytes, none of whose chunks
// verifies, each claiming as much of the rest of the file as a chunk may. `plausible`: each
// header is followed by a zstd frame header of the raw length it claims, so that every check
// that does not read the whole payload passes (only the checksum fails); else its raw length is
// too small for its compressed length. Without a bound on the work per candidate, reading it
// costs time quadratic in `size`.
std::string FakeChunkHeaders(size_t size, bool plausible);

// `trace` (a file as the writer wrote it) with its chunks in the order `chunks` gives: indexes
// into its chunks in file order (ReadSummary::chunks), an index given twice copies the chunk.
// The file header comes first and the bytes after the last chunk (the trailer) last, unchanged.
std::string Rechunk(const std::string& trace, const std::vector<size_t>& chunks);

}  // namespace torchrr::format::testing

#endif  // TORCHRR_TESTS_FORMAT_HOSTILE_TRACES_H_
