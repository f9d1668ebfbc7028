// What a trace holds that its owner may not want to share, and how `torchrr redact` rewrites it.
//
// A trace records who ran what where: the host name, the pid and the command line (FileInfo), and
// in its strings every source file's and library's path (home directories, hence user names),
// PyTorch's error messages, the string arguments of ops, and (format 1.4, unless recorded with
// --no-source) the lines of user code around the frames its stacks name. It records no environment
// and no working directory. PrivacyScan lists what a trace holds (`torchrr info`); Redaction rewrites the
// strings so that none of the names it was given is left, while file basenames, line numbers,
// op names and every id stay as they were, so that the redacted trace replays to the same verdicts.
#ifndef TORCHRR_REPLAYER_PRIVACY_H_
#define TORCHRR_REPLAYER_PRIVACY_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchrr/format/records.h"

namespace torchrr::replayer {

// The home directories in `text`: "/home/NAME" and "/Users/NAME" (followed by "/" or the end), and
// "/root"; each once, in order of appearance.
std::vector<std::string> HomeDirectories(const std::string& text);

// Streams a trace's records and keeps what `torchrr info` lists under "privacy". Not thread-safe.
class PrivacyScan {
 public:
  void See(const format::Record& record);
  void SeeInfo(const format::FileInfo& info);

  // Text lines for `torchrr info` (each "  what: ...") and the same as JSON.
  std::vector<std::string> Lines() const;
  nlohmann::json ToJson() const;

 private:
  void SeeString(const std::string& text);

  std::string host_;
  std::vector<std::string> command_line_;
  std::set<std::string> homes_;
  std::set<std::string> users_;
  uint64_t absolute_paths_ = 0;
  std::vector<std::string> path_examples_;  // The first few, for the user to see.
  uint64_t values_ = 0;                     // Non-tensor arguments recorded.
  uint64_t string_values_ = 0;
  uint64_t error_messages_ = 0;
  std::set<format::InternId> source_files_;  // SourceFile records' files.
  uint64_t source_lines_ = 0;
  uint64_t source_bytes_ = 0;
};

// The rewrite rules of `torchrr redact`, applied to every string of a trace in this order: the
// user's own --map pairs (OLD anywhere → NEW), then home directories ("/home/alice/x" → "~/x"),
// then the host and the user names as whole words (between characters that are not letters,
// digits or "_") → "<host>", "<user>": a short name inside a longer word ("vm" in "aten::_vmap")
// is left alone, so op names never change.
//
// Use: set the public lists and flags, FindNames() on every record and the file info (the first
// pass), AddThisMachine(), Finish(); then ApplyTo() on each (the second). Not thread-safe.
class Redaction {
 public:
  std::vector<std::pair<std::string, std::string>> maps;  // --map OLD=NEW, in the order given.
  std::vector<std::string> homes;                         // Longest first.
  std::vector<std::string> hosts;
  std::vector<std::string> users;
  bool drop_values = false;  // --drop-values: every op's non-tensor arguments are dropped, and
                             // the strings only they used are emptied.
  bool drop_source = false;  // --drop-source: no SourceFile or SourceLines record is kept.
  bool drop_args = false;    // --drop-args: the command line keeps only the program.

  // What a string is, for the host and user rules (--map and home directories apply to all):
  enum class Role {
    kText,  // Messages, the command line, function names: a name between non-alphanumerics
            // ("_" separates: alice_notes.txt is alice's).
    kName,  // An op, node, saved-tensor or kernel name, an error type: the verdicts' words,
            // never rewritten by a host or user rule (a host called "aten").
    kPath,  // A frame's file or library: a name that is a whole path component only
            // (/home/ana/train.py keeps train.py on a host called "train").
  };

  // Rules for a trace: `homes`, `users` and `hosts` as found by the first pass (FindNames) plus
  // this machine's user and home, so that a trace recorded here loses them even when only some
  // strings show them.
  void AddThisMachine();
  // Sorts and deduplicates the lists (the longest name first, so that "/home/al" never eats a
  // piece of "/home/alice").
  void Finish();

  // `text` rewritten; says in *changed whether anything was.
  std::string Apply(const std::string& text, bool* changed, Role role = Role::kText) const;
  // Every string of `record` (or `info`) rewritten in place, whichever field holds it (the field
  // lists of record_fields.h are walked, so that a string field added later is redacted too);
  // returns how many changed.
  int ApplyTo(format::Record& record) const;
  // Whether the record is left out of the copy (--drop-source).
  bool Drops(const format::Record& record) const;
  int ApplyTo(format::FileInfo& info) const;

  // What `torchrr redact` reports it replaced: "home directories /root -> ~; host vm -> <host>".
  std::string Describe() const;

  // The first pass: the home directories, user names and hosts in `record`'s strings, and which
  // strings only op arguments use.
  void FindNames(const format::Record& record);
  void FindNames(const format::FileInfo& info);

 private:
  // `text` rewritten in place; adds 1 to *changed when it changed.
  void Rewrite(std::string& text, int* changed, Role role = Role::kText) const;
  // Adds the home directories in `text`, and their users.
  void FindHomes(const std::string& text);

  std::set<format::InternId> value_strings_;  // Used by an argument.
  std::set<format::InternId> named_strings_;  // Used by anything else: kept by --drop-values.
  std::set<format::InternId> name_strings_;   // Role::kName.
  std::set<format::InternId> path_strings_;   // Role::kPath.
  size_t command_line_args_ = 0;              // Past the program: what --drop-args drops.
  uint64_t error_messages_ = 0;               // Kept: the replay reads them.
};

}  // namespace torchrr::replayer

#endif  // TORCHRR_REPLAYER_PRIVACY_H_
