// Native frames symbolized by the writer thread (function, file, line) before they are written.
#include "sink/trace_sink.h"

#include <string>

#include "stacks/native_stacks.h"

namespace torchrr::recorder {

format::InternId TraceSink::InternSymbolString(const std::string& text, bool* ok) {
  if (text.empty()) return 0;
  auto it = symbol_strings_.find(text);
  if (it != symbol_strings_.end()) return it->second;
  format::StringDef def{NextStringId(), text};
  if (!Emit(format::Record(def))) {
    *ok = false;
    return 0;
  }
  symbol_strings_.emplace(text, def.id);
  return def.id;
}

bool TraceSink::Symbolize(const format::FrameDef& placeholder) {
  bool ok = true;
  std::vector<format::InternId>& ids = expanded_frames_[placeholder.id];
  for (const SymbolizedFrame& symbols : SymbolizeNativeFrame(placeholder.pc)) {
    format::FrameDef frame;
    frame.id = NextFrameId();
    frame.kind = format::FrameKind::kNative;
    frame.pc = placeholder.pc;
    frame.function = InternSymbolString(symbols.function, &ok);
    frame.file = InternSymbolString(symbols.file, &ok);
    frame.library = InternSymbolString(symbols.library, &ok);
    frame.line = symbols.line;
    frame.framework = symbols.framework;
    if (!ok) return false;
    if (!Emit(format::Record(frame))) return false;
    if (!frame.framework && !WriteSource(frame.file, symbols.file, frame.line)) return false;
    ids.push_back(frame.id);
  }
  return true;
}

}  // namespace torchrr::recorder
