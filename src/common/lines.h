// The one line splitter of every command that reads text by lines (tokenizer train, encode and
// decode; data prepare; task and held-out jsonl files of eval): a line ends at "\n", and a "\r"
// right before it belongs to the line end, so a CRLF file reads exactly as its LF twin. Text after
// the last "\n" is a last line, kept as it is (a lone "\r" is text); an empty text has no lines.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace crucible {

class LineSplitter {
 public:
  explicit LineSplitter(std::string_view text) : text_(text) {}
  // The next line without its end; false after the last one.
  bool Next(std::string_view* line);
  // 1-based number of the line Next returned last (0 before the first).
  size_t line_number() const { return line_number_; }

 private:
  std::string_view text_;
  size_t position_ = 0;
  size_t line_number_ = 0;
};

// A text file as one document: its lines joined with "\n" (CRLF read as LF, and no line end after
// the last line), as `data prepare --split file` and `tokenizer train/encode --whole-file` read it.
std::string JoinLines(std::string_view text);

}  // namespace crucible
