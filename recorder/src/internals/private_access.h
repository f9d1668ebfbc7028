// Reading a private data member of torch's: explicit instantiation may name private members, and
// the friend function MemberAccess defines hands the pointer to member out. A torch that renames
// or retypes the member fails to compile, rather than reading the wrong bytes. One Tag type per
// member, declared where it is used, in namespace torchrr::recorder (the friend it declares must
// be the one MemberAccess defines: not in an unnamed namespace), under a name no other file of
// the recorder uses:
//
//   struct VersionCounterTag { friend constexpr auto GetMember(VersionCounterTag); };
//   template struct MemberAccess<VersionCounterTag, &c10::VariableVersion::version_counter_>;
//   ... version.*GetMember(VersionCounterTag{}) ...
#ifndef TORCHRR_RECORDER_PRIVATE_ACCESS_H_
#define TORCHRR_RECORDER_PRIVATE_ACCESS_H_

namespace torchrr::recorder {

template <typename Tag, auto Member>
struct MemberAccess {
  friend constexpr auto GetMember(Tag) { return Member; }
};

}  // namespace torchrr::recorder

#endif  // TORCHRR_RECORDER_PRIVATE_ACCESS_H_
