// The checked-in golden traces (tests/golden, written once by make_golden): a file written by
// format 1.0 must keep reading with every later reader, its records keep their JSON, and the broken
// ones keep failing the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <variant>

#include "sample_records.h"
#include "torchrr/format/json.h"
#include "torchrr/format/reader.h"

namespace torchrr::format {
namespace {

const std::string kGolden = TORCHRR_GOLDEN_DIR;

template <typename T>
const T& Nth(const Trace& trace, size_t n) {
  size_t seen = 0;
  for (const Record& r : trace.records) {
    if (const T* t = std::get_if<T>(&r); t != nullptr && seen++ == n) return *t;
  }
  ADD_FAILURE() << "no record #" << n << " of this kind";
  static const T kEmpty{};
  return kEmpty;
}

// The fields added in 1.2, as an older trace reads them: their defaults.
void ClearSince1_2(Record& r) {
  auto* node = std::get_if<NodeRecord>(&r);
  if (node == nullptr) return;
  for (SavedTensor& saved : node->saved) {
    saved.hook = SavedHook::kNone;
    saved.checked = true;
    saved.recompute_from = 0;
  }
}

// The fields added in 1.3, as an older trace reads them.
void ClearSince1_3(Record& r) {
  if (auto* exec = std::get_if<NodeExecRecord>(&r)) exec->unpacked.clear();
  auto* node = std::get_if<NodeRecord>(&r);
  if (node == nullptr) return;
  for (SavedTensor& saved : node->saved) saved.unpack_hook = 0;
}

// The fields added in 1.6.
void ClearSince1_6(Record& r) {
  if (auto* frame = std::get_if<FrameDef>(&r)) frame->origin = 0;
}

// The fields added in 1.7.
void ClearSince1_7(Record& r) {
  if (auto* node = std::get_if<NodeRecord>(&r)) {
    for (SavedTensor& saved : node->saved) saved.used_at = 0;
  }
}

// The fields added in 1.8.
void ClearSince1_8(Record& r) {
  if (auto* op = std::get_if<OpRecord>(&r)) op->module_path = 0;
}

void ClearSince1_9(Record& r) {
  if (auto* t = std::get_if<TensorInfo>(&r)) t->inner = 0;
}

void ClearSince1_16(Record& r) {
  if (auto* op = std::get_if<OpRecord>(&r)) {
    op->input_ranges.clear();
    op->output_ranges.clear();
  }
}

// How many record kinds a minor version has: Record's first ones.
size_t KindsOf(uint16_t minor) { return minor < 4 ? 12 : minor < 5 ? 14 : kRecordKindCount; }

// The records of `want` as a trace of that minor version holds them: without the kinds added
// since, the fields added since at their defaults.
void AsOf(uint16_t minor, std::vector<Record>& want) {
  std::erase_if(want, [&](const Record& r) { return r.index() >= KindsOf(minor); });
  for (Record& r : want) {
    if (minor < 2) ClearSince1_2(r);
    if (minor < 3) ClearSince1_3(r);
    if (minor < 6) ClearSince1_6(r);
    if (minor < 7) ClearSince1_7(r);
    if (minor < 8) ClearSince1_8(r);
    if (minor < 9) ClearSince1_9(r);
    if (minor < 16) ClearSince1_16(r);
  }
}

TEST(Golden, V1_0ReadsEveryKind) {
  Trace trace = ReadTraceFileAll(kGolden + "/v1_0.trr");
  ASSERT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  EXPECT_TRUE(trace.summary.has_index);
  EXPECT_EQ(trace.summary.header.major, 1);
  EXPECT_EQ(trace.summary.header.minor, 0);
  EXPECT_EQ(trace.summary.header.oldest_reader_major, 1);
  EXPECT_EQ(trace.summary.header.oldest_reader_minor, 0);
  EXPECT_GE(trace.summary.chunks.size(), 4u);
  for (size_t i = 0; i < kRecordKindCount; ++i) {
    EXPECT_EQ(trace.summary.records_per_kind[i], i < KindsOf(0) ? 2u : 0u) << RecordKindNameAt(i);
  }

  ASSERT_TRUE(trace.summary.has_info);
  const FileInfo& info = trace.summary.info;
  EXPECT_EQ(info.torch_version, "2.4.1+cu121");
  EXPECT_EQ(info.host, "golden-host");
  EXPECT_EQ(info.pid, 4242);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.start_time_unix_ns, 1700000000123456789);
  EXPECT_EQ(info.command_line.size(), 4u);

  // Literal values, one or more per kind (the second step: base 1100, old id 38, t0 2e9).
  EXPECT_EQ(Nth<StringDef>(trace, 1).text, "aten::add_1100");
  EXPECT_EQ(Nth<StringDef>(trace, 1).id, 101u);
  EXPECT_EQ(Nth<FrameDef>(trace, 1).pc, 0x7f00dead0000u + 1100);
  EXPECT_EQ(Nth<FrameDef>(trace, 1).kind, FrameKind::kPython);
  EXPECT_EQ(Nth<FrameDef>(trace, 1).line, 42u);
  EXPECT_EQ(Nth<StackDef>(trace, 1).frames, (std::vector<InternId>{102, 102, 7}));
  const TensorInfo& tensor = Nth<TensorInfo>(trace, 1);
  EXPECT_EQ(tensor.tensor, 1110u);
  EXPECT_EQ(tensor.storage, 1105u);
  EXPECT_EQ(tensor.version_counter, 38u);
  EXPECT_EQ(tensor.grad_fn, 1120u);
  EXPECT_EQ(tensor.shape, (std::vector<int64_t>{4, 1024, 4096}));
  EXPECT_EQ(tensor.device, (Device{1, 3}));
  EXPECT_FALSE(tensor.is_leaf);
  const OpRecord& op = Nth<OpRecord>(trace, 1);
  EXPECT_EQ(op.op, 1130u);
  EXPECT_EQ(op.parent, 1125u);
  EXPECT_EQ(op.start_ns, 2'000'001'000);
  EXPECT_EQ(op.end_ns, 2'000'000'900);
  EXPECT_EQ(op.scope, OpScope::kBackwardFunction);
  EXPECT_EQ(op.sequence_nr, 1234);
  EXPECT_FALSE(op.grad_mode);
  ASSERT_EQ(op.inputs.size(), 3u);
  EXPECT_EQ(op.inputs[1].tensor, 38u);
  EXPECT_EQ(op.inputs[0].version_after, 4u);
  EXPECT_EQ(op.inputs[0].list_index, TensorUse::kNotInList);
  ASSERT_EQ(op.values.size(), 3u);
  EXPECT_EQ(op.values[1].d_imag, -0.75);
  EXPECT_EQ(op.values[2].ints.back(), INT64_MIN);
  const NodeRecord& node = Nth<NodeRecord>(trace, 1);
  EXPECT_EQ(node.node, 1120u);
  EXPECT_EQ(node.created_by, 1130u);
  EXPECT_EQ(node.saved_kind, SavedSetKind::kCustom);
  ASSERT_EQ(node.edges.size(), 3u);
  EXPECT_EQ(node.edges[2].node, 38u);
  ASSERT_EQ(node.saved.size(), 2u);
  EXPECT_EQ(node.saved[0].version_counter, 38u);
  EXPECT_FALSE(node.saved[0].defined);
  EXPECT_TRUE(node.saved[1].defined);
  EXPECT_EQ(Nth<NodeExecRecord>(trace, 1).op, 1132u);
  EXPECT_EQ(Nth<NodeExecRecord>(trace, 1).end_ns, 2'000'002'500);
  EXPECT_EQ(Nth<ErrorRecord>(trace, 1).kind, ErrorKind::kPythonException);
  EXPECT_EQ(Nth<ErrorRecord>(trace, 1).time_ns, 2'000'002'600);
  EXPECT_EQ(Nth<CudaKernelRecord>(trace, 1).grid.x, 128u);
  EXPECT_EQ(Nth<CudaKernelRecord>(trace, 1).block.y, 4u);
  EXPECT_EQ(Nth<CudaMemcpyRecord>(trace, 1).kind, CudaCopyKind::kDeviceToHost);
  EXPECT_EQ(Nth<CudaMemcpyRecord>(trace, 1).memset_value, 0xabu);
  EXPECT_EQ(Nth<DataLossRecord>(trace, 1).reason, "ring buffer full");
  EXPECT_EQ(Nth<DataLossRecord>(trace, 1).records, 12u);
  EXPECT_EQ(Nth<FingerprintRecord>(trace, 1).hash, 0x0123456789abcdefu);
  EXPECT_EQ(Nth<FingerprintRecord>(trace, 1).when, FingerprintWhen::kAtUse);
  EXPECT_EQ(Nth<FingerprintRecord>(trace, 1).time_ns, 2'000'003'000);

  // And every field of every record, as sample_records.cc made them, but for the fields added
  // since 1.0, which read as their defaults.
  std::vector<Record> want = testing::ManySteps(2);
  AsOf(0, want);
  for (Record& r : want) {
    if (auto* t = std::get_if<TensorInfo>(&r)) t->storage_address = 0;  // 1.1
  }
  ASSERT_EQ(trace.records.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(trace.records[i], want[i]) << "record " << i;
}

// A golden trace of format 1.<minor>, read whole: its header, and every record as
// sample_records.cc makes them, the fields added after that minor version at their defaults.
void ExpectEveryField(const std::string& file, uint16_t minor) {
  Trace trace = ReadTraceFileAll(kGolden + file);
  ASSERT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  EXPECT_EQ(trace.summary.header.major, 1);
  EXPECT_EQ(trace.summary.header.minor, minor);
  // Step coding is read from 1.10 on, its recent ids from 1.11 on, its offset deltas from 1.12,
  // its recent ids by kind from 1.13, its node execution times from 1.14, its times from the
  // previous steps' from 1.15; 1.16 codes as 1.15.
  EXPECT_EQ(trace.summary.header.oldest_reader_minor,
            minor < 10 ? 0 : std::min<uint16_t>(minor, kOldestStepCodingReaderMinor));
  std::vector<Record> want = testing::ManySteps(2);
  AsOf(minor, want);
  ASSERT_EQ(trace.records.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(trace.records[i], want[i]) << "record " << i;
}

TEST(Golden, V1_1ReadsEveryField) {
  ExpectEveryField("/v1_1.trr", 1);
  EXPECT_EQ(Nth<TensorInfo>(ReadTraceFileAll(kGolden + "/v1_1.trr"), 1).storage_address,
            0x7f3a12345000u);
}

TEST(Golden, V1_2ReadsEveryField) {
  ExpectEveryField("/v1_2.trr", 2);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_2.trr");
  const NodeRecord& node = Nth<NodeRecord>(trace, 1);
  ASSERT_FALSE(node.saved.empty());
  EXPECT_EQ(node.saved[0].hook, SavedHook::kCheckpoint);
  EXPECT_FALSE(node.saved[0].checked);
  EXPECT_EQ(node.saved[0].unpack_hook, 0u);
}

TEST(Golden, V1_3ReadsEveryField) {
  ExpectEveryField("/v1_3.trr", 3);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_3.trr");
  const NodeRecord& node = Nth<NodeRecord>(trace, 1);
  ASSERT_FALSE(node.saved.empty());
  EXPECT_NE(node.saved[0].unpack_hook, 0u);
  EXPECT_EQ(node.saved[0].unpack_hook, Nth<StackDef>(trace, 1).id);
  const NodeExecRecord& exec = Nth<NodeExecRecord>(trace, 1);
  ASSERT_EQ(exec.unpacked.size(), 1u);
  EXPECT_EQ(exec.unpacked[0].dtype, 5);
  EXPECT_EQ(exec.unpacked[0].saved_shape, (std::vector<int64_t>{4, 8}));
}

TEST(Golden, V1_4ReadsEveryField) {
  ExpectEveryField("/v1_4.trr", 4);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_4.trr");
  EXPECT_EQ(Nth<SourceFile>(trace, 1).hash, 0xfedcba9876543210u + 1100);
  EXPECT_EQ(Nth<SourceFile>(trace, 1).lines, 120u);
  const SourceLines& lines = Nth<SourceLines>(trace, 1);
  EXPECT_EQ(lines.file, Nth<SourceFile>(trace, 1).file);
  EXPECT_EQ(lines.first_line, 40u);
  ASSERT_EQ(lines.text.size(), 4u);
  EXPECT_EQ(lines.text[3], "\ty.add_(1)  # \xc3\xa9");
}

TEST(Golden, V1_5ReadsEveryField) {
  ExpectEveryField("/v1_5.trr", 5);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_5.trr");
  EXPECT_EQ(Nth<StepRecord>(trace, 1).step, 1100u);
  EXPECT_EQ(Nth<StepRecord>(trace, 1).time_ns, 2'000'000'005);
  EXPECT_TRUE(Nth<StepRecord>(trace, 1).marked);
}

TEST(Golden, V1_6ReadsEveryField) {
  ExpectEveryField("/v1_6.trr", 6);
  EXPECT_EQ(Nth<FrameDef>(ReadTraceFileAll(kGolden + "/v1_6.trr"), 1).origin, 7u);
}

TEST(Golden, V1_7ReadsEveryField) {
  ExpectEveryField("/v1_7.trr", 7);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_7.trr");
  const NodeRecord& node = Nth<NodeRecord>(trace, 1);
  ASSERT_FALSE(node.saved.empty());
  EXPECT_EQ(node.saved[0].used_at, Nth<StackDef>(trace, 1).id);
}

TEST(Golden, V1_8ReadsEveryField) {
  ExpectEveryField("/v1_8.trr", 8);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_8.trr");
  EXPECT_EQ(Nth<OpRecord>(trace, 1).module_path, Nth<StringDef>(trace, 1).id);
}

TEST(Golden, V1_9ReadsEveryField) {
  ExpectEveryField("/v1_9.trr", 9);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_9.trr");
  const TensorInfo& wrapper = Nth<TensorInfo>(trace, 1);
  EXPECT_NE(wrapper.inner, 0u);
  EXPECT_NE(wrapper.inner, wrapper.tensor);
}

TEST(Golden, V1_16ReadsEveryField) {
  ExpectEveryField("/v1_16.trr", 16);
  const Trace trace = ReadTraceFileAll(kGolden + "/v1_16.trr");
  const OpRecord& op = Nth<OpRecord>(trace, 1);
  ASSERT_EQ(op.input_ranges.size(), op.inputs.size());
  ASSERT_EQ(op.output_ranges.size(), op.outputs.size());
  EXPECT_EQ(op.input_ranges[0].max_abs, 7.1e4f);
  EXPECT_FALSE(op.input_ranges[1].checked());
  EXPECT_FALSE(op.input_ranges[2].finite());
  EXPECT_EQ(op.output_ranges[0].flags, ValueRange::kChecked | ValueRange::kPosInf);
}

// A reader of 1.15 reads a step-coded 1.16 file (oldest reader 1.15): the ranges are fields it
// skips, appended to a table.
TEST(Golden, V1_16NeedsOnlyA1_15Reader) {
  std::ifstream in(kGolden + "/v1_16.trr", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 16u);
  EXPECT_EQ(bytes[14], 15);
}

// From 1.10 on, each minor only codes the same records otherwise: 1.10 step coding, 1.11 recent
// ids, 1.12 record offset deltas, 1.13 recent ids by kind, 1.14 node execution times from their
// op's, 1.15 times from the previous steps'. Each file reads back as the minor before's.
class GoldenRecoded : public ::testing::TestWithParam<int> {};

TEST_P(GoldenRecoded, ReadsEveryFieldAsTheMinorBefore) {
  const int minor = GetParam();
  const std::string name = "/v1_" + std::to_string(minor) + ".trr";
  ExpectEveryField(name, static_cast<uint16_t>(minor));
  const Trace previous = ReadTraceFileAll(kGolden + "/v1_" + std::to_string(minor - 1) + ".trr");
  const Trace trace = ReadTraceFileAll(kGolden + name);
  EXPECT_TRUE(previous.records == trace.records);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenRecoded, ::testing::Values(10, 11, 12, 13, 14, 15),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "V1_" + std::to_string(info.param);
                         });

// 1.15's times coded from the steps' before, on steps that repeat (every kind's records of
// v1_15.trr make no step): they read back as written.
TEST(Golden, V1_15StepsReadsItsTimes) {
  const Trace trace = ReadTraceFileAll(kGolden + "/steps/v1_15.trr");
  ASSERT_TRUE(trace.summary.status.ok()) << trace.summary.status.message();
  EXPECT_EQ(trace.summary.header.minor, 15);
  EXPECT_TRUE(trace.records == testing::TrainingSteps(6));
}

// A reader of 1.14 or before refuses a file of 1.15's step coding (oldest reader 1.15) rather than
// find its batches' coding unknown, one of 1.13 or before a file of 1.14's (oldest reader 1.14)
// for the same reason, one of 1.12 or before a file of 1.13's (oldest reader 1.13)
// rather than decode its recent ids by kind wrong, one of 1.11 or before a file of 1.12's (oldest
// reader 1.12) rather than find its record batches corrupt, one of 1.10 or before a file of 1.11's
// (oldest reader 1.11) rather than decode its recent ids as 0, and one of 1.9 or before a 1.10 file
// (oldest reader 1.10) rather than decode wrong times: what this reader does with a file whose
// oldest reader is newer than itself.
TEST(Golden, StepCodedFileNeedsAReaderOfItsCoding) {
  for (const auto& [name, oldest] : {std::pair{"/v1_10.trr", 10}, std::pair{"/v1_11.trr", 11},
                                     std::pair{"/v1_12.trr", 12}, std::pair{"/v1_13.trr", 13},
                                     std::pair{"/v1_14.trr", 14}, std::pair{"/v1_15.trr", 15}}) {
    std::ifstream in(kGolden + name, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 16u);
    EXPECT_EQ(bytes[14], oldest) << name;  // oldest_reader_minor, little-endian.
    EXPECT_EQ(bytes[15], 0);
    bytes[14] = static_cast<char>(kFormatMinor + 1);  // As this reader sees a later minor's file.
    bytes[10] = static_cast<char>(kFormatMinor + 1);
    EXPECT_EQ(ReadTraceBytesAll(bytes).summary.status.code(), StatusCode::kTooNew);
  }
}

// The records' JSON (`torchrr dump --json` after its first line) keeps its keys, their order and
// its values: v1_1.json is that of v1_1.trr.
TEST(Golden, V1_1Json) {
  Trace trace = ReadTraceFileAll(kGolden + "/v1_1.trr");
  std::ifstream json(kGolden + "/v1_1.json");
  ASSERT_TRUE(json.good());
  size_t i = 0;
  for (std::string line; std::getline(json, line); ++i) {
    ASSERT_LT(i, trace.records.size());
    EXPECT_EQ(RecordToJson(trace.records[i]).dump(), line) << "record " << i;
  }
  EXPECT_EQ(i, trace.records.size());
}

TEST(Golden, ErrorFiles) {
  struct Case {
    const char* file;
    StatusCode code;
    const char* message_prefix;
  };
  const Case cases[] = {
      {"truncated.trr", StatusCode::kTruncated, "truncated after chunk 2"},
      {"corrupt.trr", StatusCode::kCorrupt, "chunk 3 @ 0x"},
      {"too_new.trr", StatusCode::kTooNew,
       "written by torchrr format 2.0; this torchrr reads up to 1."},
      {"not_a_trace.trr", StatusCode::kNotATrace, "not a torchrr trace"},
      // Crafted (make_golden --hostile).
      {"reordered.trr", StatusCode::kCorrupt,
       "chunk 2 @ 0xb6: out of order, read after chunk 3, which it continues (corrupt)"},
      {"duplicated.trr", StatusCode::kCorrupt, "chunk 3 @ 0x1cc: a copy of chunk 2, skipped"},
      {"fake_headers.trr", StatusCode::kCorrupt, "chunk 1 @ 0x10: checksum mismatch (corrupt)"},
      {"source_paths.trr", StatusCode::kOk, ""},
      {"escapes.trr", StatusCode::kOk, ""},
      {"non_utf8.trr", StatusCode::kOk, ""},
  };
  for (const Case& c : cases) {
    Trace trace = ReadTraceFileAll(kGolden + "/errors/" + c.file);
    EXPECT_EQ(trace.summary.status.code(), c.code) << c.file;
    EXPECT_EQ(trace.summary.status.message().rfind(c.message_prefix, 0), 0u)
        << c.file << ": " << trace.summary.status.message();
  }
  // Data still comes back from the broken ones.
  EXPECT_GT(ReadTraceFileAll(kGolden + "/errors/truncated.trr").records.size(), 0u);
  Trace corrupt = ReadTraceFileAll(kGolden + "/errors/corrupt.trr");
  EXPECT_GT(corrupt.records.size(), 0u);
  EXPECT_TRUE(corrupt.summary.has_index);
}

// The crafted files keep what verifies: the training loop's records, in the order written, from
// its chunks swapped or copied; and 256 KiB of fake chunk headers cost bounded work.
TEST(Golden, CraftedFilesKeepWhatVerifies) {
  Trace reordered = ReadTraceFileAll(kGolden + "/errors/reordered.trr");
  Trace duplicated = ReadTraceFileAll(kGolden + "/errors/duplicated.trr");
  EXPECT_GT(reordered.records.size(), 100u);
  EXPECT_EQ(reordered.records, duplicated.records);
  ReadSummary fake = ReadTraceFileAll(kGolden + "/errors/fake_headers.trr").summary;
  EXPECT_TRUE(fake.chunks.empty());
  EXPECT_LE(fake.checksummed_bytes, 9 * fake.file_size + (128u << 20));
  EXPECT_NE(std::find_if(fake.warnings.begin(), fake.warnings.end(),
                         [](const std::string& w) { return w.find("work limit") != w.npos; }),
            fake.warnings.end());
}

}  // namespace
}  // namespace torchrr::format
