// Records for the format tests and the golden file: every kind, every field away from its default.
#ifndef TORCHRR_TESTS_FORMAT_SAMPLE_RECORDS_H_
#define TORCHRR_TESTS_FORMAT_SAMPLE_RECORDS_H_

#include <cstdint>
#include <ostream>
#include <vector>

#include "torchrr/format/records.h"

namespace torchrr::format::testing {

FileInfo SampleFileInfo();

// One record of every kind (in Record's alternative order), each field set to a value that is not
// its default. Object ids are `base + small`, with some references to ids at or below `old_id`
// (ids of an earlier batch) so that every branch of the id coder runs; times start at `t0`.
std::vector<Record> EveryKind(uint64_t base, uint64_t old_id, int64_t t0);

// `steps` repetitions of EveryKind with growing ids and times: many chunks when written with a
// small chunk size.
std::vector<Record> ManySteps(int steps);

// `steps` training steps as the recorder writes them (format/SPEC.md "Steps"): two forward ops
// that create a node each, a backward function that runs one, an optimizer op; the same ops in
// every step, their times a few microseconds apart with up to 200 ns of jitter.
std::vector<Record> TrainingSteps(int steps);

}  // namespace torchrr::format::testing

namespace torchrr::format {

// gtest prints records and FileInfos as their JSON.
void PrintTo(const Record& record, std::ostream* os);
void PrintTo(const FileInfo& info, std::ostream* os);

}  // namespace torchrr::format

#endif  // TORCHRR_TESTS_FORMAT_SAMPLE_RECORDS_H_
