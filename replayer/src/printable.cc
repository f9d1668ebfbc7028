#include "torchrr/replayer/printable.h"

#include <cstdint>
#include <cstdio>

namespace torchrr::replayer {
namespace {

// The length of the valid UTF-8 sequence at the start of `s` (1 to 4) and its code point, or 0
// when it is not one (overlong forms and surrogates included).
size_t DecodeUtf8(std::string_view s, char32_t* code_point) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  uint8_t lead = byte(0);
  size_t length = 0;
  if (lead < 0x80) {
    length = 1;
  } else if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
  }
  if (length == 0 || length > s.size()) return 0;
  char32_t c = length == 1 ? lead : lead & (0x7f >> length);
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return 0;
    c = (c << 6) | (byte(i) & 0x3f);
  }
  static constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kSmallest[length] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
  *code_point = c;
  return length;
}

// Characters that move or hide text on a terminal: C1 controls, the line and paragraph
// separators, and the bidirectional embeddings, overrides and isolates.
bool IsInvisibleControl(char32_t c) {
  return (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 ||
         (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

}  // namespace

std::string Printable(std::string_view text, char quote) {
  std::string out;
  out.reserve(text.size());
  char escape[16];
  for (size_t i = 0; i < text.size();) {
    char32_t c = 0;
    size_t length = DecodeUtf8(text.substr(i), &c);
    if (length == 0) {
      std::snprintf(escape, sizeof(escape), "\\x%02x", static_cast<uint8_t>(text[i]));
      out += escape;
      ++i;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      std::snprintf(escape, sizeof(escape), "\\x%02x", static_cast<unsigned>(c));
      out += escape;
    } else if (IsInvisibleControl(c)) {
      std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned>(c));
      out += escape;
    } else if (c == '\\' || (quote != '\0' && c == static_cast<unsigned char>(quote))) {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

std::string Shortened(std::string_view text) {
  if (text.size() <= kMaxShownStringBytes) return std::string(text);
  size_t keep = kMaxShownStringBytes - 64;  // Room for the note, within the bound.
  // Back to the first byte of a UTF-8 sequence (never more than 3 continuation bytes).
  for (int i = 0; i < 3 && keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80;
       ++i) {
    --keep;
  }
  return std::string(text.substr(0, keep)) + "... [" + std::to_string(text.size()) + " bytes]";
}

}  // namespace torchrr::replayer
