#include "common/lines.h"

namespace crucible {

bool LineSplitter::Next(std::string_view* line) {
  if (position_ >= text_.size()) return false;
  size_t end = text_.find('\n', position_);
  size_t next = end + 1;
  if (end == std::string_view::npos) {
    end = next = text_.size();
  } else if (end > position_ && text_[end - 1] == '\r') {
    --end;
  }
  *line = text_.substr(position_, end - position_);
  position_ = next;
  ++line_number_;
  return true;
}

std::string JoinLines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  LineSplitter lines(text);
  std::string_view line;
  for (bool first = true; lines.Next(&line); first = false) {
    if (!first) out += '\n';
    out += line;
  }
  return out;
}

}  // namespace crucible
