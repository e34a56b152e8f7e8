// UTF-8 helpers for the tokenizer: the GPT-2 byte <-> character map that byte-level BPE writes
// its tokens in, and validation / lossy repair of UTF-8 the way Python and Rust do it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace crucible {

// The character that stands for byte b in byte-level tokens ('!'..'~' themselves, the rest
// shifted to U+0100.. so that every token is printable), as a code point.
uint32_t ByteToCodepoint(uint8_t byte);
// The byte a character stands for; -1 if the character is not one of the 256.
int CodepointToByte(uint32_t codepoint);

void AppendUtf8(uint32_t codepoint, std::string* out);
// Raw bytes -> their byte-level spelling ("hello world" -> "helloĠworld").
std::string BytesToByteLevel(std::string_view bytes);
// Byte-level spelling -> raw bytes. False (and *out unspecified) if `token` is not valid UTF-8
// or has a character outside the byte-level alphabet.
bool ByteLevelToBytes(std::string_view token, std::string* out);

// Decodes the code point at text[*pos] (which must be valid UTF-8) and advances *pos.
uint32_t NextCodepoint(std::string_view text, size_t* pos);
bool IsValidUtf8(std::string_view text);
// Replaces each maximal invalid subsequence by U+FFFD, exactly as Rust's
// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do.
std::string RepairUtf8(std::string_view text);

}  // namespace crucible
