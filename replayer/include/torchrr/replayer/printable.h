// Printable: a string from a trace, as it may be printed to a terminal.
//
// A trace may come from a stranger, and every string in it (file and function names, op names,
// PyTorch's messages, the host, the command line) is bytes its writer chose: an escape sequence
// would retitle or clear the terminal, a newline would forge a line of the report ("error: ..."),
// and bytes that are not UTF-8 would garble it. Every text output of torchrr (the text report,
// `info`, `dump`) prints each such string through Printable, so that one string stays on its line
// and shows every byte it has. JSON output carries the strings themselves (replayer/SCHEMA.md).
#ifndef TORCHRR_REPLAYER_PRINTABLE_H_
#define TORCHRR_REPLAYER_PRINTABLE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace torchrr::replayer {

// `text` with every character that is not printable shown as an escape, and the rest, valid UTF-8
// included, unchanged:
//   a newline, carriage return or tab       \n \r \t
//   another C0 control, DEL                 \x1b \x7f
//   a C1 control, a line or paragraph       \u009b \u2028 \u202e
//   separator, a bidirectional override
//   a byte that is not part of valid UTF-8  \xe9
//   a backslash                             \\       (so that every escape reads one way)
//   `quote` (when not '\0')                 \"       (for a string printed between quotes)
// A string without any of these comes back unchanged. Thread-safe.
std::string Printable(std::string_view text, char quote = '\0');

// The most of one interned string (an op, file or function name, a message) that the verbs that
// read a trace keep and show. A trace defines a string once and its records name it any number
// of times: without a bound, a 1 MB name that 1,000 ops use makes 1 GB of `dump` and `export`,
// and as many of the replay's memory.
inline constexpr size_t kMaxShownStringBytes = 8192;

// `text` when it is at most kMaxShownStringBytes long; else its first bytes, cut before a UTF-8
// sequence, then "... [N bytes]" with its whole length. Thread-safe.
std::string Shortened(std::string_view text);

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_PRINTABLE_H_
