// Writes the golden traces of tests/golden: run once by hand when a format version is added, never
// by the tests (which read the checked-in files, so a change that breaks reading old files fails).
//
//   build/bin/make_golden tests/golden             every file below
//   build/bin/make_golden --hostile tests/golden   the crafted files of errors/ only
//
// v1_<minor>.trr: every record kind (tests/format/sample_records.cc, two steps) in several chunks,
// as this version writes them (v1_0.trr by format 1.0, v1_1.trr by 1.1; the older ones stay).
// steps/v1_<minor>.trr (from 1.15): six training steps that repeat (TrainingSteps), one chunk;
// apart from the files above, which hold every kind of record and which the tests take as such.
// errors/: truncated.trr (cut inside chunk 3), corrupt.trr (a payload byte of chunk 3 flipped),
// too_new.trr (format 2.0, oldest reader 2.0), not_a_trace.trr (text).
// errors/, crafted as a stranger could (docs/reliability.md; what each must give is checked by
// tests/format/golden_test.cc and tests/replayer/check_hostile_traces.py), each a training loop
// of eight steps whose sixth modifies a saved weight in place (one violation):
//   source_paths.trr   the culprit's and the victim's lines are line 1 of /proc/self/environ and
//                      of /dev/zero
//   escapes.trr        its names, messages, host and command line carry terminal escapes and
//                      newlines that forge "error:" lines
//   non_utf8.trr       its script's path, host and command line are Latin-1, not UTF-8
//   reordered.trr      its record chunks swapped in pairs, the index and trailer kept
//   duplicated.trr     every record chunk written twice
//   fake_headers.trr   no trace: 256 KiB of chunk headers claiming the rest of the file
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "hostile_traces.h"
#include "sample_records.h"
#include "torchrr/format/reader.h"
#include "torchrr/format/writer.h"
#include "trace_builder.h"

namespace {

using namespace torchrr::format;

bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::fprintf(stderr, "make_golden: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

// The strings a stranger's trace controls.
struct Strings {
  std::string file = "/home/ana/project/train.py";
  std::string function = "train_step";
  std::string optimizer_step = "aten::add_";
  std::string node = "MulBackward0";
  std::string message =
      "one of the variables needed for gradient computation has been modified by an inplace "
      "operation: [torch.FloatTensor [4]] is at version 6; expected version 5 instead.";
  std::string host = "golden-host";
  std::vector<std::string> command_line = {"python", "train.py"};
};

// A training loop of eight steps, y = w * x, loss = y.sum(), backward, then w.add_() under no_grad
// (the optimizer); the sixth step runs the optimizer before its backward, which then raises: one
// violation. In chunks of about 600 raw bytes. `victim_file`, `culprit_file`: where the buggy
// step's mul and add_ ran, at line 1, instead of s.file. `unnamed`: the strings naming the node
// and its saved members are left out, so the records name strings the trace does not define.
std::string TrainingLoop(const Strings& s, const std::string& victim_file = "",
                         const std::string& culprit_file = "", bool unnamed = false) {
  auto at = [&](torchrr::testing::TraceBuilder& b, bool buggy, const std::string& file,
                uint32_t line) {
    return buggy && !file.empty() ? b.At(1, file, s.function) : b.At(line, s.file, s.function);
  };
  torchrr::testing::TraceBuilder b;
  auto w = b.Leaf({4});
  for (int step = 0; step < 8; ++step) {
    auto x = b.Tensor({4});
    bool buggy = step == 5;
    auto y = b.Forward("aten::mul", s.node, {w, x}, {{"self", w}, {"other", x}},
                       at(b, buggy, victim_file, 10));
    auto loss = b.Forward("aten::sum", "SumBackward0", {y.out}, {}, b.At(11, s.file, s.function),
                          {});
    auto optimizer_step = [&] {
      b.Inplace(s.optimizer_step, w, {}, at(b, buggy, culprit_file, 12), false);
    };
    if (buggy) optimizer_step();
    b.Backward({loss.node, y.node}, buggy ? y.node : 0, buggy ? s.message : "");
    if (buggy) break;
    optimizer_step();
  }
  FileInfo info = testing::SampleFileInfo();
  info.host = s.host;
  info.command_line = s.command_line;
  std::string trace;
  WriterOptions options;
  options.chunk_raw_bytes = 600;
  auto writer = TraceWriter::ToString(&trace, info, options);
  for (const Record& r : b.records) {
    const auto* def = std::get_if<StringDef>(&r);
    if (unnamed && def != nullptr &&
        (def->text == s.node || def->text == "self" || def->text == "other")) {
      continue;
    }
    (void)writer->Append(r);
  }
  (void)writer->Close();
  return trace;
}

// The crafted files of errors/.
bool WriteHostile(const std::string& dir) {
  const std::string errors = dir + "/errors/";
  Strings escapes;
  escapes.file = "/tmp/\x1b]0;pwned\x07train.py";
  escapes.function = "train_step\nerror: forged by the trace";
  escapes.optimizer_step = "aten::add_\x1b[2J\x1b[H";
  escapes.node = "MulBackward0\r\nerror: forged node\xc2\x9b" "31m";
  escapes.message += "\n\x1b[1;31merror:\x1b[0m forged message";
  escapes.host = "host\x1b[8m";
  escapes.command_line = {"python", "train\x1b]2;title\x07.py", "--lr\n1e-4"};
  Strings latin1;
  latin1.file = "/home/ana/caf\xe9/train.py";
  latin1.function = "\xe9tape";
  latin1.host = "h\xf4te";
  latin1.command_line = {"python", "/home/ana/caf\xe9/train.py"};

  std::string loop = TrainingLoop(Strings());
  ReadSummary summary = ReadTraceBytes(loop, nullptr);
  const size_t n = summary.chunks.size();  // File info, record batches, index.
  std::vector<size_t> reordered;
  std::vector<size_t> duplicated;
  for (size_t i = 0; i < n; ++i) {
    bool batch = i > 0 && i + 1 < n;
    reordered.push_back(batch && i + 1 < n - 1 && i % 2 == 1 ? i + 1
                        : batch && i % 2 == 0 && i > 1       ? i - 1
                                                             : i);
    duplicated.push_back(i);
    if (batch) duplicated.push_back(i);
  }
  // A 1 MiB name that every frame of every op names: output and memory must not grow with the
  // string times its uses.
  Strings long_strings;
  long_strings.function = std::string(1u << 20, 'f');
  long_strings.node = "MulBackward0" + std::string(64u << 10, 'n');
  // A stranger's frames naming this machine's private files, for which the trace has no code.
  const std::string private_files = TrainingLoop(Strings(), "/root/.ssh/id_rsa",
                                                 "/home/ana/.aws/credentials");
  // A recording cut before its first record: the file header and the FileInfo chunk alone.
  const ReadSummary chunks = ReadTraceBytes(loop, nullptr);
  const std::string zero_records =
      loop.substr(0, chunks.chunks.size() > 1 ? chunks.chunks[1].offset : loop.size());
  // Op ids that double (2, 4, ... 2^61) and 20,000 threads with one op each: a replay's per-id
  // and per-thread tables must grow with the records, not with the largest id or threads squared.
  torchrr::testing::TraceBuilder sparse;
  for (int k = 1; k < 62; ++k) sparse.Op({.name = "aten::add_", .id = uint64_t{1} << k});
  torchrr::testing::TraceBuilder threads;
  for (uint32_t t = 1; t <= 20000; ++t) threads.Op({.name = "aten::mul", .thread = t});
  auto trace_of = [](const torchrr::testing::TraceBuilder& b) {
    std::string trace;
    auto writer = TraceWriter::ToString(&trace, testing::SampleFileInfo());
    for (const Record& r : b.records) (void)writer->Append(r);
    (void)writer->Close();
    return trace;
  };
  return WriteFile(errors + "doubling_ids.trr", trace_of(sparse)) &&
         WriteFile(errors + "many_threads.trr", trace_of(threads)) &&
         WriteFile(errors + "long_strings.trr", TrainingLoop(long_strings)) &&
         WriteFile(errors + "private_files.trr", private_files) &&
         WriteFile(errors + "zero_records.trr", zero_records) &&
         WriteFile(errors + "dangling_names.trr", TrainingLoop(Strings(), "", "", true)) &&
         WriteFile(errors + "source_paths.trr",
                   TrainingLoop(Strings(), "/dev/zero", "/proc/self/environ")) &&
         WriteFile(errors + "escapes.trr", TrainingLoop(escapes)) &&
         WriteFile(errors + "non_utf8.trr", TrainingLoop(latin1)) &&
         WriteFile(errors + "reordered.trr", testing::Rechunk(loop, reordered)) &&
         WriteFile(errors + "duplicated.trr", testing::Rechunk(loop, duplicated)) &&
         WriteFile(errors + "fake_headers.trr", testing::FakeChunkHeaders(256u << 10, true));
}

}  // namespace

int main(int argc, char** argv) {
  bool hostile_only = argc == 3 && std::string(argv[1]) == "--hostile";
  if (argc != 2 && !hostile_only) {
    std::fprintf(stderr, "usage: make_golden [--hostile] DIR (tests/golden)\n");
    return 2;
  }
  const std::string dir = argv[argc - 1];
  if (hostile_only) return WriteHostile(dir) ? 0 : 1;
  std::string trace;
  {
    WriterOptions options;
    options.chunk_raw_bytes = 1000;  // Several chunks.
    auto writer = TraceWriter::ToString(&trace, testing::SampleFileInfo(), options);
    for (const Record& r : testing::ManySteps(2)) {
      if (!writer->Append(r).ok()) return 1;
    }
    if (!writer->Close().ok()) return 1;
  }
  ReadSummary summary = ReadTraceBytes(trace, nullptr);
  if (!summary.status.ok() || summary.chunks.size() < 4) {
    std::fprintf(stderr, "make_golden: the trace does not read back\n");
    return 1;
  }
  const ChunkInfo& third = summary.chunks[2];
  std::string corrupt = trace;
  corrupt[third.offset + 24 + third.compressed_bytes / 2] ^= 0x01;
  std::string too_new = trace;
  const char version[8] = {2, 0, 0, 0, 2, 0, 0, 0};
  too_new.replace(8, 8, version, 8);
  const std::string name = "/v" + std::to_string(kFormatMajor) + "_" +
                           std::to_string(kFormatMinor) + ".trr";
  // Repeating training steps, whose times 1.15 codes from the steps' before: every kind's
  // records above make no step.
  std::string steps;
  {
    auto writer = TraceWriter::ToString(&steps, testing::SampleFileInfo());
    for (const Record& r : testing::TrainingSteps(6)) {
      if (!writer->Append(r).ok()) return 1;
    }
    if (!writer->Close().ok()) return 1;
  }
  bool ok = WriteFile(dir + name, trace) &&
            WriteFile(dir + "/steps" + name, steps) &&
            WriteFile(dir + "/errors/truncated.trr",
                      trace.substr(0, third.offset + 24 + third.compressed_bytes / 2)) &&
            WriteFile(dir + "/errors/corrupt.trr", corrupt) &&
            WriteFile(dir + "/errors/too_new.trr", too_new) &&
            WriteFile(dir + "/errors/not_a_trace.trr", "this is not a torchrr trace\n") &&
            WriteHostile(dir);
  return ok ? 0 : 1;
}
