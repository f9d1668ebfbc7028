// The recorder's overhead on the C++ LoRA sample's training step, on the CPU: step time without
// the recorder, with it (C++ stacks on), and with it (stacks off), measured side by side in one
// run (rounds interleave them, so machine noise hits them alike), reported as ratios to plain;
// plus trace bytes per op and the process's peak memory growth while recording. For scale, also
// libtorch's own profiler recording every op with its input shapes (Kineto, CPU activity), and
// with --floor an empty RecordFunction callback that asks for inputs and outputs. Page faults per
// step are the training thread's minor faults: memory the C library handed back to the system
// and took again (TORCHRR_BENCH_VERBOSE=1 prints them, and the step times, round by round).
// Heap growth is that of the training thread's arena (glibc's main arena, which only the main
// thread allocates from: the writer thread and torch's other threads have arenas of their own):
// its bytes in use after the timed steps, before the recorder stops, less before the recorder
// started; blocks glibc maps on their own (128 KiB and up) are counted apart, process-wide.
//
// Usage: bench_recorder [--rounds R] [--steps-per-round K] [--threads T] [--dir DIR] [--floor]
//                       [--hidden H] [--seq S] [--only-stacks-off] [--no-profiler] [--warmup W]
//                       [--trim-heap]
#include <malloc.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include "lora_model.h"
#include "torchrr/recorder.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace samples = torchrr::samples;

long MaxRssKb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// CPU time of the calling thread: set against the step's wall time it shows how much of the
// overhead the training thread computes itself, and how much it waits (for the CPU the writer
// thread takes on a busy machine, for locks).
double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Page faults taken by the calling thread so far (minor: a page mapped on first touch).
double ThreadMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return static_cast<double>(usage.ru_minflt);
}

// The main arena's bytes in use (its size less its free chunks) and the bytes of blocks mapped on
// their own, read from malloc_info's XML (mallinfo2 sums every thread's arena).
struct HeapUse {
  double arena = 0;
  double mapped = 0;
};

double XmlSize(const char* from, const char* end, const char* tag) {
  const char* at = std::strstr(from, tag);
  if (at == nullptr || (end != nullptr && at > end)) return 0;
  const char* size = std::strstr(at, "size=\"");
  return size == nullptr ? 0 : std::strtod(size + 6, nullptr);
}

HeapUse MainArenaUse() {
  char* text = nullptr;
  size_t length = 0;
  FILE* out = open_memstream(&text, &length);
  if (out == nullptr) return {};
  malloc_info(0, out);
  std::fclose(out);
  HeapUse use;
  const char* heap = std::strstr(text, "<heap nr=\"0\">");
  const char* end = heap != nullptr ? std::strstr(heap, "</heap>") : nullptr;
  if (heap != nullptr && end != nullptr) {
    use.arena = XmlSize(heap, end, "<system type=\"current\"") -
                XmlSize(heap, end, "<total type=\"fast\"") -
                XmlSize(heap, end, "<total type=\"rest\"");
  }
  const char* totals = end != nullptr ? end : text;
  use.mapped = XmlSize(totals, nullptr, "<total type=\"mmap\"");
  std::free(text);
  return use;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  int steps = 8;
  int threads = 1;
  std::string dir = std::filesystem::temp_directory_path() / "torchrr_bench_recorder";
  CLI::App app("The recorder's overhead on the C++ LoRA step (CPU)");
  app.add_option("--rounds", rounds);
  app.add_option("--steps-per-round", steps);
  app.add_option("--threads", threads, "Intra-op threads (1: less noise on a shared machine)");
  app.add_option("--dir", dir);
  size_t max_buffer_mb = 256;
  app.add_option("--max-buffer-mb", max_buffer_mb, "The recorder's queue bound");
  bool trim_heap = false;
  app.add_flag("--trim-heap", trim_heap,
               "Leave glibc's heap trimming on. Off by default: the configurations alternate in "
               "one process, and the one after plain would pay for growing back the heap that "
               "plain's steps gave back to the system (page faults), which a run that records "
               "from start to end pays once");
  int warmup = 1;
  app.add_option("--warmup", warmup,
                 "Untimed steps per configuration and round (the first records what later steps "
                 "repeat; more let the heap settle after the previous configuration)");
  bool no_profiler = false;
  app.add_flag("--no-profiler", no_profiler, "Leave out libtorch's profiler");
  bool floor = false;
  app.add_flag("--floor", floor,
               "Also time an empty RecordFunction callback that asks for what the recorder asks "
               "for (inputs and outputs): the part of the overhead that is torch's own");
  samples::LlamaConfig config;
  // A smaller model runs the same ops with less arithmetic: for instruction counts under
  // callgrind, where the matrix products would dominate the run time.
  app.add_option("--hidden", config.hidden_size);
  app.add_option("--seq", config.max_seq_len);
  bool only_recorder = false;
  app.add_flag("--only-stacks-off", only_recorder,
               "Time plain and the recorder with stacks off only (for a profiler's view of the "
               "recorder's own cost)");
  CLI11_PARSE(app, argc, argv);
  if (!trim_heap) {
    // Setting either turns off glibc's own adjustment of both: tensors up to 32 MiB stay on the
    // heap, as that adjustment puts them after the first frees.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  }
  std::filesystem::create_directories(dir);
  at::set_num_threads(threads);

  config.intermediate_size = (config.hidden_size * 8 / 3 + 31) / 32 * 32;
  torch::manual_seed(0);
  samples::LlamaForCausalLM model(config, samples::Bug::kNone);
  auto sequence = torch::randint(1, config.vocab_size, {4, config.max_seq_len + 1}, torch::kLong);
  auto tokens = sequence.narrow(1, 0, config.max_seq_len);
  auto labels = sequence.narrow(1, 1, config.max_seq_len);
  torch::optim::AdamW optimizer(model->LoraParameters(), torch::optim::AdamWOptions(1e-3));
  auto step = [&] {
    auto loss = model->forward(tokens, labels);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
  };
  for (int i = 0; i < 3; ++i) step();  // Warm up allocator and kernels.
  long rss_plain_kb = MaxRssKb();

  struct Config {
    const char* name;
    bool record;
    bool stacks;
    bool empty_callback = false;
    bool profiler = false;
    bool callback_outputs = true;  // The empty callback asks for the outputs too.
    std::vector<double> step_ms;
    std::vector<double> cpu_ms;
    std::vector<double> faults;
    std::vector<double> heap_kib;
    std::vector<double> mapped_kib;
    std::vector<double> stop_ms;
    uint64_t ops = 0;
    uint64_t bytes = 0;
  };
  std::vector<Config> configs = {{"plain", false, false, {}},
                                 {"recorder, stacks on", true, true, {}},
                                 {"recorder, stacks off", true, false, {}}};
  if (only_recorder) configs.erase(configs.begin() + 1);
  if (!no_profiler && !only_recorder) {
    configs.push_back({"torch profiler (shapes)", false, false, false, true, {}});
  }
  if (floor) {
    configs.push_back({"empty callback", false, false, true, false, true, {}});
    configs.push_back({"empty callback, inputs only", false, false, true, false, false, {}});
  }
  for (int round = 0; round < rounds; ++round) {
    for (auto& c : configs) {
      std::string path = dir + "/round" + std::to_string(round) + (c.stacks ? "_s" : "_n") + ".trr";
      HeapUse heap_before = MainArenaUse();
      std::optional<torchrr::Recorder> recorder;
      if (c.record) {
        torchrr::RecorderOptions options;
        options.path = path;
        options.native_stacks = c.stacks;
        options.max_buffered_bytes = max_buffer_mb << 20;
        recorder.emplace(options);
      }
      at::CallbackHandle empty_callback = 0;
      if (c.empty_callback) {
        empty_callback = at::addGlobalCallback(
            at::RecordFunctionCallback(
                [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
                  return nullptr;
                },
                [](const at::RecordFunction&, at::ObserverContext*) {})
                .needsInputs(true)
                .needsOutputs(c.callback_outputs)
                .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                         at::RecordScope::USER_SCOPE}));
      }
      namespace profiler = torch::autograd::profiler;
      if (c.profiler) {
        const profiler::ProfilerConfig profiler_config(profiler::ProfilerState::KINETO,
                                                       /*report_input_shapes=*/true);
        const std::set<profiler::ActivityType> cpu_only = {profiler::ActivityType::CPU};
        profiler::prepareProfiler(profiler_config, cpu_only);
        profiler::enableProfiler(profiler_config, cpu_only);
      }
      // Not timed: the first recorded step interns what later steps repeat, and the C library's
      // heap, trimmed by the previous configuration, grows back (more with --warmup).
      for (int i = 0; i < warmup; ++i) step();
      auto start = Clock::now();
      double cpu_start = ThreadCpuMs();
      double faults_start = ThreadMinorFaults();
      for (int i = 0; i < steps; ++i) step();
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      c.step_ms.push_back(ms / steps);
      c.cpu_ms.push_back((ThreadCpuMs() - cpu_start) / steps);
      c.faults.push_back((ThreadMinorFaults() - faults_start) / steps);
      HeapUse heap_after = MainArenaUse();
      c.heap_kib.push_back((heap_after.arena - heap_before.arena) / 1024);
      c.mapped_kib.push_back((heap_after.mapped - heap_before.mapped) / 1024);
      if (empty_callback != 0) at::removeCallback(empty_callback);
      if (c.profiler) profiler::disableProfiler();  // Its post-processing: not timed.
      if (recorder) {
        auto stop_start = Clock::now();
        recorder->Stop();  // Drains the queue, symbolizes new frames, closes the file.
        c.stop_ms.push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - stop_start).count());
        c.ops += recorder->ops_recorded();
        c.bytes += std::filesystem::file_size(path);
      }
    }
  }
  long rss_end_kb = MaxRssKb();

  double plain = Median(configs[0].step_ms);
  std::printf("C++ LoRA step on the CPU (hidden %lld, seq %lld, %d intra-op thread(s)), %d rounds "
              "x %d steps, medians:\n",
              static_cast<long long>(config.hidden_size),
              static_cast<long long>(config.max_seq_len), threads, rounds, steps);
  std::printf("(glibc heap trimming %s; %d untimed step(s) per configuration and round)\n",
              trim_heap ? "on" : "off", warmup);
  std::printf("| configuration | step (ms) | ratio to plain | training thread CPU (ms) | "
              "page faults/step | heap growth (KiB) | mapped growth (KiB) | trace bytes/op | "
              "close (ms) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& c : configs) {
    double ms = Median(c.step_ms);
    std::printf("| %s | %.2f | %.2fx | %.2f | %.0f | %.0f | %.0f | %s | %s |\n", c.name, ms,
                ms / plain, Median(c.cpu_ms), Median(c.faults), Median(c.heap_kib),
                Median(c.mapped_kib),
                c.ops ? std::to_string(static_cast<double>(c.bytes) / c.ops).substr(0, 5).c_str()
                      : "-",
                c.stop_ms.empty() ? "-" : std::to_string(Median(c.stop_ms)).substr(0, 6).c_str());
  }
  if (std::getenv("TORCHRR_BENCH_VERBOSE") != nullptr) {
    for (const auto& c : configs) {
      std::printf("%s: faults per step by round:", c.name);
      for (double f : c.faults) std::printf(" %.0f", f);
      std::printf("; ms:");
      for (double ms : c.step_ms) std::printf(" %.1f", ms);
      std::printf("\n");
    }
  }
  std::printf("ops per step: %.0f\n",
              static_cast<double>(configs[1].ops) /
                  (static_cast<double>(rounds) * (steps + warmup)));
  std::printf("peak memory growth while recording: %.1f MiB (maxrss %ld -> %ld KiB)\n",
              (rss_end_kb - rss_plain_kb) / 1024.0, rss_plain_kb, rss_end_kb);
  return 0;
}
