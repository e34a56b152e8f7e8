#include "tokenizer/utf8.h"

#include <array>

namespace crucible {
namespace {

struct ByteMap {
  std::array<uint32_t, 256> to_codepoint;
  std::array<int16_t, 512> to_byte;  // every mapped code point is below U+0200
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_codepoint[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_codepoint[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& Map() {
  static const ByteMap map;
  return map;
}

// Length of the valid UTF-8 sequence at text[pos], or 0 with *bad set to the length of the
// maximal invalid subpart (at least 1).
size_t ValidSequenceLength(std::string_view text, size_t pos, size_t* bad) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  unsigned char b0 = s[pos];
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= n) {
      *bad = k;
      return 0;
    }
    unsigned char c = s[pos + k];
    unsigned char lo = k == 1 ? low : 0x80, hi = k == 1 ? high : 0xBF;
    if (c < lo || c > hi) {
      *bad = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

uint32_t ByteToCodepoint(uint8_t byte) {
  return Map().to_codepoint[byte];
}

int CodepointToByte(uint32_t codepoint) {
  return codepoint < 512 ? Map().to_byte[codepoint] : -1;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) AppendUtf8(ByteToCodepoint(b), &out);
  return out;
}

uint32_t NextCodepoint(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = *pos;
  uint32_t c = s[i];
  if (c < 0x80) {
    *pos = i + 1;
    return c;
  }
  if (c < 0xE0) {
    *pos = i + 2;
    return ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
  }
  if (c < 0xF0) {
    *pos = i + 3;
    return ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
  }
  *pos = i + 4;
  return ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) |
         (s[i + 3] & 0x3F);
}

bool ByteLevelToBytes(std::string_view token, std::string* out) {
  out->clear();
  if (!IsValidUtf8(token)) return false;
  size_t pos = 0;
  while (pos < token.size()) {
    int b = CodepointToByte(NextCodepoint(token, &pos));
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
  }
  return true;
}

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0, bad = 0;
  const size_t n = text.size();
  while (pos < n) {
    // Eight ASCII bytes at a time.
    while (pos + 8 <= n) {
      uint64_t word;
      __builtin_memcpy(&word, text.data() + pos, 8);
      if (word & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= n) break;
    size_t len = ValidSequenceLength(text, pos, &bad);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

std::string RepairUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0, bad = 0;
  while (pos < text.size()) {
    size_t len = ValidSequenceLength(text, pos, &bad);
    if (len > 0) {
      out.append(text.data() + pos, len);
      pos += len;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += bad;
    }
  }
  return out;
}

}  // namespace crucible
