// The interpreter of jinja.h: walks the syntax tree of jinja_parse.h over scopes of Values.
// Scoping is Jinja's: a for loop's body, a macro and a {% with %} get a scope of their own (a
// {% set %} there is gone when they end, and every iteration starts from the outer values),
// {% if %} does not; namespaces carry values out of loops.
#include "sft/jinja.h"

#include <map>

#include "sft/jinja_builtins.h"

namespace crucible::jinja {
namespace {

using Scope = std::map<std::string, Value, std::less<>>;

struct Macro {
  const Stmt* stmt;
  size_t scope_depth;  // the scopes the macro sees: those open where it was defined
};

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits, const nlohmann::ordered_json& variables)
      : limits_(limits) {
    scopes_.emplace_back();
    if (!variables.is_object())
      throw Error(Error::kRuntime, 0, "the template's variables are not a JSON object");
    for (const auto& [key, value] : variables.items()) scopes_[0][key] = FromJson(value);
  }

  std::string Run(const Body& body) {
    Exec(body);
    return std::move(out_);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  void Step(int line, int64_t count = 1) {
    steps_ += count;
    if (steps_ > limits_.max_steps)
      throw Error(Error::kLimit, line,
                  "the template ran more than " + std::to_string(limits_.max_steps) + " steps");
  }

  // Work beyond one step: a string counts a step per 64 bytes it holds, a list one per item, so
  // a loop that copies big values runs out of steps instead of running for hours.
  const Value& Charge(const Value& value, int line) {
    if (value.is_string() && value.string().size() >= 64)
      Step(line, static_cast<int64_t>(value.string().size() / 64));
    else if (value.type() == Value::Type::kList)
      Step(line, static_cast<int64_t>(value.list().items.size()));
    return value;
  }

  void Write(const std::string& text, int line) {
    Step(line, static_cast<int64_t>(text.size() / 64));
    if (out_.size() + text.size() > limits_.max_output_bytes)
      throw Error(
          Error::kLimit, line,
          "the template's output passed " + std::to_string(limits_.max_output_bytes) + " bytes");
    out_ += text;
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    Value global = GlobalFunction(name);
    if (!global.is_undefined()) return global;
    return Value::Undefined(name);
  }

  Flow Exec(const Body& body) {
    for (const auto& stmt : body) {
      Flow flow = ExecOne(*stmt);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  // Runs `body` with its output captured instead of written.
  std::string Capture(const Body& body) {
    std::string saved = std::move(out_);
    out_.clear();
    Exec(body);
    std::string captured = std::move(out_);
    out_ = std::move(saved);
    return captured;
  }

  Flow ExecOne(const Stmt& stmt) {
    Step(stmt.line);
    switch (stmt.kind) {
      case Stmt::kText:
        Write(stmt.text, stmt.line);
        return Flow::kNormal;
      case Stmt::kOutput:
        Write(ToString(Eval(*stmt.expr)), stmt.line);
        return Flow::kNormal;
      case Stmt::kIf:
        for (const auto& [condition, body] : stmt.branches)
          if (Truthy(Eval(*condition))) return Exec(body);
        return Exec(stmt.else_body);
      case Stmt::kFor:
        return ExecFor(stmt);
      case Stmt::kSet: {
        Value value = Eval(*stmt.expr);
        Assign(stmt, std::move(value));
        return Flow::kNormal;
      }
      case Stmt::kSetBlock: {
        Value value(Capture(stmt.body));
        if (stmt.expr) value = ApplyChain(*stmt.expr, value);
        scopes_.back()[stmt.targets[0]] = std::move(value);
        return Flow::kNormal;
      }
      case Stmt::kMacro:
        DefineMacro(stmt);
        return Flow::kNormal;
      case Stmt::kBreak:
        return Flow::kBreak;
      case Stmt::kContinue:
        return Flow::kContinue;
      case Stmt::kFilterBlock: {
        Value text(Capture(stmt.body));
        Write(ToString(ApplyChain(*stmt.expr, text)), stmt.line);
        return Flow::kNormal;
      }
      case Stmt::kWith: {
        Scope scope;
        for (const auto& [name, expr] : stmt.assignments) scope[name] = Eval(*expr);
        scopes_.push_back(std::move(scope));
        Flow flow = Exec(stmt.body);
        scopes_.pop_back();
        return flow;
      }
      case Stmt::kGeneration:
        return Exec(stmt.body);
    }
    return Flow::kNormal;
  }

  // A filter chain parsed over an empty literal (set blocks, filter blocks), applied to `input`.
  Value ApplyChain(const Expr& chain, const Value& input) {
    if (chain.kind != Expr::kFilter) return input;
    Value inner = ApplyChain(*chain.args[0], input);
    CallArgs args = EvalArgs(chain, 1);
    return ApplyFilter(chain.name, inner, args, chain.line);
  }

  void Assign(const Stmt& stmt, Value value) {
    if (!stmt.attribute.empty()) {
      Value target = Lookup(stmt.targets[0]);
      if (target.type() != Value::Type::kNamespace)
        throw Error(Error::kRuntime, stmt.line, "cannot assign attribute on non-namespace object");
      target.dict().Set(stmt.attribute, std::move(value));
      return;
    }
    if (stmt.targets.size() == 1) {
      scopes_.back()[stmt.targets[0]] = std::move(value);
      return;
    }
    std::vector<Value> items = Iterate(value, stmt.line);
    if (items.size() != stmt.targets.size())
      throw Error(Error::kRuntime, stmt.line,
                  "cannot unpack " + std::to_string(items.size()) + " values into " +
                      std::to_string(stmt.targets.size()) + " names");
    for (size_t i = 0; i < items.size(); ++i) scopes_.back()[stmt.targets[i]] = items[i];
  }

  void BindTargets(const Stmt& stmt, const Value& item, Scope* scope) {
    if (stmt.targets.size() == 1) {
      (*scope)[stmt.targets[0]] = item;
      return;
    }
    std::vector<Value> parts = Iterate(item, stmt.line);
    if (parts.size() != stmt.targets.size())
      throw Error(Error::kRuntime, stmt.line,
                  "cannot unpack " + std::to_string(parts.size()) + " values into " +
                      std::to_string(stmt.targets.size()) + " loop variables");
    for (size_t i = 0; i < parts.size(); ++i) (*scope)[stmt.targets[i]] = parts[i];
  }

  Flow ExecFor(const Stmt& stmt) {
    std::vector<Value> all = Iterate(Eval(*stmt.expr), stmt.line);
    std::vector<Value> items;
    if (stmt.condition) {  // `for x in y if cond`: the loop (and loop.length) sees the kept ones
      for (const Value& item : all) {
        Scope scope;
        BindTargets(stmt, item, &scope);
        scopes_.push_back(std::move(scope));
        bool keep = Truthy(Eval(*stmt.condition));
        scopes_.pop_back();
        if (keep) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return Exec(stmt.else_body);
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      Step(stmt.line);
      Scope scope;
      BindTargets(stmt, items[i], &scope);
      DictData loop;
      loop.Set("index", Value(i + 1));
      loop.Set("index0", Value(i));
      loop.Set("revindex", Value(length - i));
      loop.Set("revindex0", Value(length - i - 1));
      loop.Set("first", Value(i == 0));
      loop.Set("last", Value(i == length - 1));
      loop.Set("length", Value(length));
      loop.Set("depth", Value(int64_t{1}));
      loop.Set("depth0", Value(int64_t{0}));
      loop.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("previtem"));
      loop.Set("nextitem", i + 1 < length ? items[i + 1] : Value::Undefined("nextitem"));
      int line = stmt.line;
      loop.Set("cycle", Value::Callable("loop.cycle", [i, line](CallArgs& args) -> Value {
                 if (args.positional.empty())
                   throw Error(Error::kRuntime, line, "no items for cycling given");
                 return args.positional[static_cast<size_t>(i) % args.positional.size()];
               }));
      loop.Set("changed", Value::Callable("loop.changed", [line](CallArgs&) -> Value {
                 throw Error(Error::kUnsupported, line, "loop.changed()");
               }));
      scope["loop"] = Value::Namespace(std::move(loop));
      scopes_.push_back(std::move(scope));
      Flow flow = Exec(stmt.body);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void DefineMacro(const Stmt& stmt) {
    Macro macro{&stmt, scopes_.size()};
    Value callable = Value::Callable(
        stmt.name, [this, macro](CallArgs& args) { return CallMacro(macro, args); });
    scopes_.back()[stmt.name] = std::move(callable);
  }

  Value CallMacro(const Macro& macro, CallArgs& args) {
    const Stmt& stmt = *macro.stmt;
    if (++call_depth_ > limits_.max_call_depth)
      throw Error(Error::kLimit, stmt.line,
                  "macro calls nest more than " + std::to_string(limits_.max_call_depth) + " deep");
    BoundArgs bound(args, "macro '" + stmt.name + "'", stmt.params, stmt.line);
    // The macro runs in the scopes open at its definition plus one of its own; the caller's
    // deeper scopes are set aside meanwhile.
    size_t depth = std::min(macro.scope_depth, scopes_.size());
    std::vector<Scope> hidden(
        std::make_move_iterator(scopes_.begin() + static_cast<std::ptrdiff_t>(depth)),
        std::make_move_iterator(scopes_.end()));
    scopes_.resize(depth);
    Scope scope;
    for (size_t i = 0; i < stmt.params.size(); ++i) {
      if (bound.Get(i))
        scope[stmt.params[i]] = *bound.Get(i);
      else if (stmt.defaults[i])
        scope[stmt.params[i]] = Eval(*stmt.defaults[i]);
      else
        scope[stmt.params[i]] = Value::Undefined(stmt.params[i]);
    }
    scopes_.push_back(std::move(scope));
    std::string text;
    try {
      text = Capture(stmt.body);
    } catch (...) {
      scopes_.resize(depth);
      for (auto& s : hidden) scopes_.push_back(std::move(s));
      --call_depth_;
      throw;
    }
    scopes_.resize(depth);
    for (auto& s : hidden) scopes_.push_back(std::move(s));
    --call_depth_;
    return Value(std::move(text));
  }

  CallArgs EvalArgs(const Expr& expr, size_t first) {
    CallArgs args;
    for (size_t i = first; i < expr.args.size(); ++i)
      args.positional.push_back(Eval(*expr.args[i]));
    for (const auto& [name, value] : expr.kwargs) args.keywords.emplace_back(name, Eval(*value));
    return args;
  }

  Value Eval(const Expr& expr) {
    Step(expr.line);
    Value value = EvalUncharged(expr);
    switch (expr.kind) {
      case Expr::kLiteral:
      case Expr::kName:
      case Expr::kGetAttr:
      case Expr::kGetItem:
        return value;  // no new value was built
      default:
        return Charge(value, expr.line);
    }
  }

  Value EvalUncharged(const Expr& expr) {
    switch (expr.kind) {
      case Expr::kLiteral:
        return expr.literal;
      case Expr::kName:
        return Lookup(expr.name);
      case Expr::kList:
      case Expr::kTuple: {
        std::vector<Value> items;
        for (const auto& item : expr.args) items.push_back(Eval(*item));
        return Value::List(std::move(items), expr.kind == Expr::kTuple);
      }
      case Expr::kDict: {
        DictData dict;
        for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
          Value key = Eval(*expr.args[i]);
          if (!key.is_string())
            throw Error(Error::kUnsupported, expr.line, "a dict literal with a non-string key");
          dict.Set(key.string(), Eval(*expr.args[i + 1]));
        }
        return Value::Dict(std::move(dict));
      }
      case Expr::kGetAttr:
        return GetAttribute(Eval(*expr.args[0]), expr.name, expr.line);
      case Expr::kGetItem: {
        Value object = Eval(*expr.args[0]);
        return GetItem(object, Eval(*expr.args[1]), expr.line);
      }
      case Expr::kSlice: {
        Value object = Eval(*expr.args[0]);
        auto part = [&](size_t i) { return expr.args[i] ? Eval(*expr.args[i]) : Value::None(); };
        Value start = part(1), stop = part(2), step = part(3);
        return SliceOf(object, start, stop, step, expr.line);
      }
      case Expr::kCall: {
        Value callee = Eval(*expr.args[0]);
        CallArgs args = EvalArgs(expr, 1);
        if (callee.is_undefined())
          throw Error(Error::kRuntime, expr.line, "'" + callee.undefined_name() + "' is undefined");
        if (callee.type() != Value::Type::kCallable)
          throw Error(Error::kRuntime, expr.line,
                      "'" + TypeName(callee) + "' object is not callable");
        try {
          return callee.Call(args);
        } catch (const Error& e) {  // a global function knows no line: name the call's
          if (e.line() != 0) throw;
          throw Error(e.kind(), expr.line, e.what());
        }
      }
      case Expr::kFilter: {
        Value input = Eval(*expr.args[0]);
        CallArgs args = EvalArgs(expr, 1);
        return ApplyFilter(expr.name, input, args, expr.line);
      }
      case Expr::kTest: {
        Value input = Eval(*expr.args[0]);
        CallArgs args = EvalArgs(expr, 1);
        return Value(ApplyTest(expr.name, input, args, expr.line) != expr.negated);
      }
      case Expr::kNegate:
        return Negate(Eval(*expr.args[0]), expr.name == "-", expr.line);
      case Expr::kNot:
        return Value(!Truthy(Eval(*expr.args[0])));
      case Expr::kAnd: {
        Value left = Eval(*expr.args[0]);
        return Truthy(left) ? Eval(*expr.args[1]) : left;
      }
      case Expr::kOr: {
        Value left = Eval(*expr.args[0]);
        return Truthy(left) ? left : Eval(*expr.args[1]);
      }
      case Expr::kBinary: {
        Value left = Eval(*expr.args[0]);
        return BinaryOperation(expr.name, left, Eval(*expr.args[1]), expr.line);
      }
      case Expr::kCompare: {
        Value left = Eval(*expr.args[0]);
        for (size_t i = 0; i < expr.ops.size(); ++i) {
          Value right = Eval(*expr.args[i + 1]);
          if (!CompareOp(expr.ops[i], left, right, expr.line)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::kConditional:
        if (Truthy(Eval(*expr.args[0]))) return Eval(*expr.args[1]);
        return expr.args[2] ? Eval(*expr.args[2]) : Value::Undefined("conditional expression");
    }
    return Value();
  }

  static bool CompareOp(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in") return Contains(b, a, line);
    if (op == "notin") return !Contains(b, a, line);
    for (const Value* v : {&a, &b})
      if (v->is_undefined())
        throw Error(Error::kRuntime, line, "'" + v->undefined_name() + "' is undefined");
    int order = Compare(a, b, line);
    if (op == "<") return order < 0;
    if (op == "<=") return order <= 0;
    if (op == ">") return order > 0;
    return order >= 0;
  }

  RenderLimits limits_;
  std::vector<Scope> scopes_;
  std::string out_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

Template Template::Parse(std::string_view source, const LexOptions& options) {
  Template result;
  result.body_ = std::make_shared<const Body>(ParseTemplate(source, options));
  return result;
}

std::string Template::Render(const nlohmann::ordered_json& variables,
                             const RenderLimits& limits) const {
  Interpreter interpreter(limits, variables);
  return interpreter.Run(*body_);
}

}  // namespace crucible::jinja
