// The syntax tree of a Jinja template and the parser that builds it from jinja_lexer.h's tokens.
// The grammar is jinja2/parser.py's, less what chat templates do not use; those constructs are
// Error::kUnsupported naming the construct.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sft/jinja_lexer.h"
#include "sft/jinja_value.h"

namespace crucible::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // args
    kTuple,        // args
    kDict,         // args: key, value, key, value, ...
    kGetAttr,      // args[0].name
    kGetItem,      // args[0][args[1]]
    kSlice,        // args[0][args[1]:args[2]:args[3]] (absent parts null)
    kCall,         // args[0](args[1:], kwargs)
    kFilter,       // args[0] | name(args[1:], kwargs)
    kTest,         // args[0] is [not] name(args[1:], kwargs)
    kNegate,       // -args[0] (name "-") or +args[0] (name "+")
    kNot,          // not args[0]
    kAnd,          // args[0] and args[1]
    kOr,           // args[0] or args[1]
    kBinary,       // args[0] name args[1]: + - * / // % ** ~
    kCompare,      // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    kConditional,  // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;  // kTest: `is not`
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (condition, body) ...; else_body
    kFor,       // for targets in expr [if condition]: body; else_body
    kSet,       // set targets (or namespace targets[0].attribute) = expr
    kSetBlock,  // set targets[0] [| filters in expr]: body
    kMacro,     // macro name(params = defaults): body
    kBreak,
    kContinue,
    kFilterBlock,  // filter expr (a filter chain on kLiteral ""): body
    kWith,         // with assignments: body
    kGeneration,   // Hugging Face's {% generation %}: body, rendered as is
  };
  Kind kind;
  int line = 0;
  std::string text, name, attribute;
  ExprPtr expr, condition;
  std::vector<std::string> targets;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per parameter; null when it has none
  std::vector<std::pair<std::string, ExprPtr>> assignments;
};

// Parses a template; throws Error (kSyntax, kUnsupported, kLimit) naming the line.
Body ParseTemplate(std::string_view source, const LexOptions& options);

}  // namespace crucible::jinja
