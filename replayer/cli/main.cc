// torchrr: the command line. Parses arguments and hands each verb to its own file (commands.h).
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "replay_command.h"
#include "torchrr/format/reader.h"

int main(int argc, char** argv) {
  CLI::App app("torchrr: records every tensor op of a PyTorch training step and replays it "
               "offline to find the in-place op that broke autograd.",
               "torchrr");
  app.set_version_flag("--version", std::string("torchrr ") + TORCHRR_VERSION + " (trace format " +
                                        std::to_string(torchrr::format::kFormatMajor) + "." +
                                        std::to_string(torchrr::format::kFormatMinor) + ")");
  app.footer(torchrr::cli::ExitCodesText());
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // Prints help, the version or the usage error.
    return rc == 0 ? 0 : torchrr::cli::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchrr: error: %s\n", e.what());
    return torchrr::cli::kExitOther;
  }
  return exit_code;
}
