// torchrr redact's rewrite rules (torchrr/replayer/privacy.h): which occurrences of a name change.
#include "torchrr/replayer/privacy.h"

#include <gtest/gtest.h>

namespace torchrr::replayer {
namespace {

TEST(HomeDirectories, FindsEachOnceInOrder) {
  EXPECT_EQ(HomeDirectories("/home/ana/a.py /Users/bo/b.py /home/ana/c.py /root/d.py"),
            (std::vector<std::string>{"/home/ana", "/Users/bo", "/root"}));
  EXPECT_EQ(HomeDirectories("/home/"), std::vector<std::string>{});
  EXPECT_EQ(HomeDirectories("/rooted/x /x/root"), std::vector<std::string>{});
  EXPECT_EQ(HomeDirectories("/home/ana"), std::vector<std::string>{"/home/ana"});
}

Redaction Rules() {
  Redaction r;
  r.maps = {{"secret", "public"}};
  r.homes = {"/home/al", "/home/alice"};
  r.hosts = {"vm"};
  r.users = {"al"};
  r.Finish();
  return r;
}

TEST(Redaction, HomesAreWholePathComponentsLongestFirst) {
  Redaction r = Rules();
  EXPECT_EQ(r.Apply("/home/alice/x.py", nullptr), "~/x.py");
  EXPECT_EQ(r.Apply("/home/al/x.py", nullptr), "~/x.py");
  EXPECT_EQ(r.Apply("/home/alfred/x.py", nullptr), "/home/alfred/x.py");
}

TEST(Redaction, HostAndUserOnlyAsWholeWords) {
  Redaction r = Rules();
  EXPECT_EQ(r.Apply("aten::_vmap", nullptr), "aten::_vmap");
  EXPECT_EQ(r.Apply("vm:29500 al@vm", nullptr), "<host>:29500 <user>@<host>");
  EXPECT_EQ(r.Apply("alpha", nullptr), "alpha");
}

TEST(Redaction, MapsComeFirstAndSayWhetherAnythingChanged) {
  Redaction r = Rules();
  bool changed = false;
  EXPECT_EQ(r.Apply("/home/alice/secret/x.py", &changed), "~/public/x.py");
  EXPECT_TRUE(changed);
  EXPECT_EQ(r.Apply("aten::mul_", &changed), "aten::mul_");
  EXPECT_FALSE(changed);
}

TEST(Redaction, EveryStringFieldIsRewritten) {
  Redaction r = Rules();
  format::FileInfo info{.cuda_version = "/home/al/cuda", .host = "vm",
                        .command_line = {"python", "/home/alice/x.py"}};
  EXPECT_EQ(r.ApplyTo(info), 3);
  EXPECT_EQ(info.cuda_version, "~/cuda");
  EXPECT_EQ(info.host, "<host>");
  EXPECT_EQ(info.command_line[1], "~/x.py");
  format::Record error = format::ErrorRecord{.message = "cannot open /home/al/a.pt on vm"};
  format::Record loss = format::DataLossRecord{.reason = "disk full: /home/al/run.trr"};
  EXPECT_EQ(r.ApplyTo(error), 1);
  EXPECT_EQ(r.ApplyTo(loss), 1);
  EXPECT_EQ(std::get<format::ErrorRecord>(error).message, "cannot open ~/a.pt on <host>");
  EXPECT_EQ(std::get<format::DataLossRecord>(loss).reason, "disk full: ~/run.trr");
}

TEST(Redaction, DropValuesEmptiesOnlyStringsNothingElseUses) {
  Redaction r;
  r.drop_values = true;
  format::OpRecord op;
  op.name = 1;
  op.values = {format::Value{.kind = format::ValueKind::kString, .s = 2},
               format::Value{.kind = format::ValueKind::kString, .s = 1}};
  r.FindNames(format::Record(op));
  r.Finish();
  format::Record name = format::StringDef{1, "aten::pad"};
  format::Record value = format::StringDef{2, "reflect"};
  format::Record record = op;
  EXPECT_EQ(r.ApplyTo(name), 0);
  EXPECT_EQ(std::get<format::StringDef>(name).text, "aten::pad");
  EXPECT_EQ(r.ApplyTo(value), 1);
  EXPECT_EQ(std::get<format::StringDef>(value).text, "");
  EXPECT_EQ(r.ApplyTo(record), 1);
  EXPECT_TRUE(std::get<format::OpRecord>(record).values.empty());
}

// A host or user name that is also a word of the verdicts (an op or saved name) or a file's name
// keeps them: names are never rewritten by those rules, paths only as whole components. In text a
// name joined by "_" is the name.
TEST(Redaction, NamesKeepTheirWordsPathsTheirFileNames) {
  Redaction r;
  r.hosts = {"train", "aten"};
  r.users = {"alice", "ana"};
  r.homes = {"/home/ana"};
  r.Finish();
  using Role = Redaction::Role;
  EXPECT_EQ(r.Apply("/home/ana/train.py", nullptr, Role::kPath), "~/train.py");
  EXPECT_EQ(r.Apply("/data/train/x.py", nullptr, Role::kPath), "/data/<host>/x.py");
  EXPECT_EQ(r.Apply("aten::add_", nullptr, Role::kName), "aten::add_");
  EXPECT_EQ(r.Apply("alice_notes.txt", nullptr), "<user>_notes.txt");
  EXPECT_EQ(r.Apply("connect to aten:29500", nullptr), "connect to <host>:29500");

  // Through a whole trace's records: each string's role comes from what names it.
  format::OpRecord op;
  op.name = 1;
  format::FrameDef frame;
  frame.id = 1;
  frame.file = 2;
  frame.function = 3;
  format::NodeRecord node;
  node.saved.push_back(format::SavedTensor{.name = 4});
  r.FindNames(format::Record(op));
  r.FindNames(format::Record(frame));
  r.FindNames(format::Record(node));
  auto rewritten = [&](format::InternId id, const std::string& text) {
    format::Record def = format::StringDef{id, text};
    r.ApplyTo(def);
    return std::get<format::StringDef>(def).text;
  };
  EXPECT_EQ(rewritten(1, "aten::add_"), "aten::add_");
  EXPECT_EQ(rewritten(2, "/home/ana/train.py"), "~/train.py");
  EXPECT_EQ(rewritten(3, "alice_step"), "<user>_step");
  EXPECT_EQ(rewritten(4, "train"), "train");
  EXPECT_EQ(rewritten(5, "a message from train"), "a message from <host>");
}

// What a default redact keeps is said: the command line's arguments (which --drop-args drops) and
// the error messages the replay reads.
TEST(Redaction, TheSummarySaysWhatItKept) {
  Redaction r;
  format::FileInfo info{.command_line = {"python", "train.py", "--token", "s3cr3t"}};
  r.FindNames(info);
  r.FindNames(format::Record(format::ErrorRecord{.message = "token s3cr3t refused"}));
  r.Finish();
  EXPECT_NE(r.Describe().find("kept: 3 command-line arguments (--drop-args drops them), 1 error "
                              "message"),
            std::string::npos)
      << r.Describe();
  r.drop_args = true;
  format::FileInfo copy = info;
  r.ApplyTo(copy);
  EXPECT_EQ(copy.command_line, std::vector<std::string>{"python"});
  EXPECT_NE(r.Describe().find("command-line arguments dropped"), std::string::npos);
}

}  // namespace
}  // namespace torchrr::replayer
