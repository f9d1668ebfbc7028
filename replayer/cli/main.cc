// torchrr: the command line. Parses arguments and hands each verb to its own file (commands.h).
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "launch/recorder_dirs.h"
#include "memory_limit.h"
#include "replay_command.h"
#include "torchrr/replayer/printable.h"
#include "torchrr/format/reader.h"

namespace {

// The verbs that read a trace: their memory is bounded by its decompressed size (memory_limit.h),
// set once their arguments are parsed and before they run.
constexpr const char* kTraceReadingVerbs[] = {"info",   "dump",   "replay", "export",
                                              "redact", "report", "fix",    "repro"};

// The trace the bound was set for, named by the error line.
std::string g_bounded_trace;

void AddMemoryLimit(CLI::App& verb) {
  auto given = std::make_shared<std::string>();
  verb.add_option("--max-memory", *given,
                  "The most memory this verb may use before it stops with exit code 14 (bytes, "
                  "or with K, M, G, T; default: 16 times the trace's decompressed size plus 1 GiB)")
      ->type_name("SIZE")
      ->check([](const std::string& text) {
        uint64_t bytes = 0;
        return torchrr::cli::ParseByteSize(text, &bytes) && bytes > 0
                   ? std::string()
                   : std::string("expected a size such as 8G");
      });
  CLI::App* self = &verb;
  verb.parse_complete_callback([self, given] {
    uint64_t bytes = 0;
    const std::vector<std::string> traces = self->get_option("FILE")->results();
    if (given->empty() || !torchrr::cli::ParseByteSize(*given, &bytes)) {
      bytes = torchrr::cli::MemoryLimitFor(traces);
    }
    g_bounded_trace = traces.empty() ? std::string("the trace") : traces.front();
    torchrr::cli::SetMemoryLimit(bytes);
  });
}

// Help a person reads: each option's metavar (FILE, SECONDS) instead of the parser's type and
// checks ("TEXT:FILE", "FLOAT:FLOAT in [1 - 86400]"), and its default in its description.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    std::string out;
    if (opt->get_type_size() != 0 && !opt->get_positional()) {
      // The type name as given, before the validators' descriptions CLI11 appends after ':'.
      std::string metavar = opt->get_type_name();
      metavar = metavar.substr(0, metavar.find(':'));
      if (!metavar.empty()) out += " " + metavar;
      if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " ...";
    }
    if (opt->get_required() && !opt->get_positional()) out += " (required)";
    return out;
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    if (!opt->get_default_str().empty()) desc += " (default: " + opt->get_default_str() + ")";
    return desc;
  }
};

}  // namespace

int main(int argc, char** argv) {
  torchrr::cli::SetInvokedAs(argc > 0 ? argv[0] : nullptr);
  CLI::App app("torchrr: records every tensor op of a PyTorch training step and replays it "
               "offline to find the in-place op that broke autograd.",
               "torchrr");
  app.set_version_flag("--version", std::string("torchrr ") + TORCHRR_VERSION + " (trace format " +
                                        std::to_string(torchrr::format::kFormatMajor) + "." +
                                        std::to_string(torchrr::format::kFormatMinor) + ")");
  app.formatter(std::make_shared<HelpFormatter>());
  app.require_subcommand(1);

  int exit_code = 0;
  torchrr::cli::RegisterInfoCommand(app, &exit_code);
  torchrr::cli::RegisterDumpCommand(app, &exit_code);
  torchrr::cli::RegisterRecordCommand(app, &exit_code);
  torchrr::cli::RegisterReplayCommand(app, &exit_code);
  torchrr::cli::RegisterExportCommand(app, &exit_code);
  torchrr::cli::RegisterRedactCommand(app, &exit_code);
  torchrr::cli::RegisterReportCommand(app, &exit_code);
  torchrr::cli::RegisterFixCommand(app, &exit_code);
  torchrr::cli::RegisterReproCommand(app, &exit_code);

  for (const char* verb : kTraceReadingVerbs) AddMemoryLimit(*app.get_subcommand(verb));
  // After the verbs, which would inherit it: each lists only the codes it returns.
  app.footer(torchrr::cli::ExitCodesText());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // Prints help, the version or the usage error.
    return rc == 0 ? 0 : torchrr::cli::kExitUsage;
  } catch (const std::bad_alloc&) {
    const uint64_t limit = torchrr::cli::MemoryLimit();
    torchrr::cli::SetMemoryLimit(0);
    std::fprintf(stderr,
                 "torchrr: error: %s: needs more memory than this verb's bound (%llu MiB; "
                 "--max-memory raises it)\n",
                 torchrr::replayer::Printable(g_bounded_trace).c_str(),
                 static_cast<unsigned long long>((limit + (1 << 20) - 1) >> 20));
    return torchrr::cli::kExitMemory;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchrr: error: %s\n", e.what());
    return torchrr::cli::kExitOther;
  }
  return exit_code;
}
