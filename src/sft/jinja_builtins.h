// The operations of template values that Jinja delegates to Python: attribute and item access
// (with the methods of str and dict), operators, iteration, and the filters, tests and global
// functions. Internal to the interpreter (jinja.cc); every failure is a jinja::Error naming the
// line, and an unimplemented filter, test or method is Error::kUnsupported naming it.
#pragma once

#include <string>
#include <vector>

#include "sft/jinja_value.h"

namespace crucible::jinja {

constexpr size_t kMaxValueBytes = size_t{64} << 20;  // a string built by +, ~, *, join, replace

[[noreturn]] inline void Unsupported(int line, const std::string& what) {
  throw Error(Error::kUnsupported, line, what);
}
[[noreturn]] inline void RuntimeError(int line, const std::string& what) {
  throw Error(Error::kRuntime, line, what);
}
// The value as a str or an int, or a kRuntime Error naming `what`.
const std::string& ExpectString(const Value& value, const std::string& what, int line);
int64_t ExpectInt(const Value& value, const std::string& what, int line);

// Binds a call's arguments to parameter names, as Python does (positional first, then keywords);
// too many or unknown ones are a kRuntime Error naming `function`.
class BoundArgs {
 public:
  BoundArgs(CallArgs& call, const std::string& function, const std::vector<std::string>& names,
            int line);
  const Value* Get(size_t index) const { return values_[index]; }  // null when not passed
  Value Or(size_t index, Value fallback) const {
    return values_[index] ? *values_[index] : fallback;
  }

 private:
  std::vector<const Value*> values_;
};

// str.name / dict.name as a bound method (Undefined when the type has no such method).
Value StringMethod(const std::string& text, const std::string& name, int line);
Value DictMethod(const Value& dict, const std::string& name, int line);

Value GetAttribute(const Value& object, const std::string& name, int line);  // object.name
Value GetItem(const Value& object, const Value& key, int line);              // object[key]
Value SliceOf(const Value& object, const Value& start, const Value& stop, const Value& step,
              int line);
Value BinaryOperation(const std::string& op, const Value& a, const Value& b, int line);
Value Negate(const Value& value, bool minus, int line);
bool Contains(const Value& container, const Value& item, int line);  // item in container
std::vector<Value> Iterate(const Value& value, int line);            // for x in value

Value ApplyFilter(const std::string& name, const Value& input, CallArgs& args, int line);
bool ApplyTest(const std::string& name, const Value& input, CallArgs& args, int line);
// The global functions every template sees (range, dict, namespace, raise_exception, and the
// unsupported ones by name); Undefined for other names.
Value GlobalFunction(const std::string& name);

}  // namespace crucible::jinja
