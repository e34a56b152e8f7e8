// The parser of the Jinja subset: see jinja_parse.h. Function names follow jinja2/parser.py
// (parse_or, parse_compare, ...) so the two can be read side by side.
#include "sft/jinja_parse.h"

#include "sft/jinja_lexer.h"
#include "tokenizer/utf8.h"

namespace crucible::jinja {
namespace {

constexpr int kMaxDepth = 200;  // nesting of expressions and statements

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body ParseAll() {
    Body body = ParseBody({});
    if (Current().kind != Token::kEof) Fail("unexpected '" + Current().value + "'");
    return body;
  }

 private:
  const Token& Current() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(const char* op) const { return Current().kind == Token::kOp && Current().value == op; }
  bool IsName(const char* name) const {
    return Current().kind == Token::kName && Current().value == name;
  }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  [[noreturn]] void Fail(const std::string& message) const {
    throw Error(Error::kSyntax, Current().line, message);
  }
  std::string Describe(const Token& token) const {
    switch (token.kind) {
      case Token::kEof:
        return "end of template";
      case Token::kBlockEnd:
        return "end of statement block";
      case Token::kVarEnd:
        return "end of print statement";
      case Token::kText:
        return "template data";
      default:
        return "'" + token.value + "'";
    }
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', got " + Describe(Current()));
  }
  std::string ExpectName() {
    if (Current().kind != Token::kName) Fail("expected a name, got " + Describe(Current()));
    std::string name = Current().value;
    Next();
    return name;
  }
  void ExpectBlockEnd() {
    if (Current().kind != Token::kBlockEnd)
      Fail("expected end of statement block, got " + Describe(Current()));
    Next();
  }
  struct DepthGuard {
    explicit DepthGuard(Parser* parser) : parser(parser) {
      if (++parser->depth_ > kMaxDepth)
        throw Error(Error::kLimit, parser->Current().line, "the template nests more than 200 deep");
    }
    ~DepthGuard() { --parser->depth_; }
    Parser* parser;
  };

  // Statements until a block tag named in `ends` (left unconsumed, its name current) or EOF.
  Body ParseBody(const std::vector<std::string>& ends) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& token = Current();
      if (token.kind == Token::kEof) {
        if (!ends.empty()) Fail("unexpected end of template, expected '" + ends[0] + "'");
        return body;
      }
      if (token.kind == Token::kText) {
        auto stmt = NewStmt(Stmt::kText);
        stmt->text = token.value;
        body.push_back(std::move(stmt));
        Next();
      } else if (token.kind == Token::kVarBegin) {
        Next();
        auto stmt = NewStmt(Stmt::kOutput);
        stmt->expr = ParseTuple(true);
        if (Current().kind != Token::kVarEnd)
          Fail("expected end of print statement, got " + Describe(Current()));
        Next();
        body.push_back(std::move(stmt));
      } else if (token.kind == Token::kBlockBegin) {
        Next();
        if (Current().kind != Token::kName) Fail("tag name expected");
        const std::string name = Current().value;
        for (const std::string& end : ends)
          if (name == end) return body;
        body.push_back(ParseStatement(name));
      } else {
        Fail("unexpected " + Describe(token));
      }
    }
  }

  std::unique_ptr<Stmt> NewStmt(Stmt::Kind kind) const {
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = kind;
    stmt->line = Current().line;
    return stmt;
  }

  std::unique_ptr<Stmt> ParseStatement(const std::string& name) {
    Next();  // the tag name
    if (name == "if") return ParseIf();
    if (name == "for") return ParseFor();
    if (name == "set") return ParseSet();
    if (name == "macro") return ParseMacro();
    if (name == "filter") return ParseFilterBlock();
    if (name == "with") return ParseWith();
    if (name == "generation") {
      auto stmt = NewStmt(Stmt::kGeneration);
      ExpectBlockEnd();
      stmt->body = ParseBody({"endgeneration"});
      Next();
      ExpectBlockEnd();
      return stmt;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) Fail("'" + name + "' outside of a loop");
      auto stmt = NewStmt(name == "break" ? Stmt::kBreak : Stmt::kContinue);
      ExpectBlockEnd();
      return stmt;
    }
    static const char* kKnown[] = {"call",  "include",    "import", "from",  "extends",
                                   "block", "autoescape", "do",     "print", "trans"};
    for (const char* known : kKnown)
      if (name == known)
        throw Error(Error::kUnsupported, Current().line, "statement '{% " + name + " %}'");
    Fail("encountered unknown tag '" + name + "'");
  }

  std::unique_ptr<Stmt> ParseIf() {
    auto stmt = NewStmt(Stmt::kIf);
    while (true) {
      ExprPtr condition = ParseTuple(false);
      ExpectBlockEnd();
      Body body = ParseBody({"elif", "else", "endif"});
      stmt->branches.emplace_back(std::move(condition), std::move(body));
      std::string tag = Current().value;
      Next();
      if (tag == "elif") continue;
      if (tag == "else") {
        ExpectBlockEnd();
        stmt->else_body = ParseBody({"endif"});
        Next();
      }
      ExpectBlockEnd();
      return stmt;
    }
  }

  std::unique_ptr<Stmt> ParseFor() {
    auto stmt = NewStmt(Stmt::kFor);
    bool parenthesised = SkipOp("(");
    do {
      stmt->targets.push_back(ExpectName());
    } while (SkipOp(","));
    if (parenthesised) ExpectOp(")");
    if (!SkipName("in")) Fail("expected 'in', got " + Describe(Current()));
    stmt->expr = ParseTuple(false, {"recursive"});
    if (SkipName("if")) stmt->condition = ParseExpression();
    if (IsName("recursive"))
      throw Error(Error::kUnsupported, Current().line, "recursive for loops");
    ExpectBlockEnd();
    ++loop_depth_;
    stmt->body = ParseBody({"endfor", "else"});
    --loop_depth_;
    if (Current().value == "else") {
      Next();
      ExpectBlockEnd();
      stmt->else_body = ParseBody({"endfor"});
    }
    Next();
    ExpectBlockEnd();
    return stmt;
  }

  std::unique_ptr<Stmt> ParseSet() {
    auto stmt = NewStmt(Stmt::kSet);
    std::string first = ExpectName();
    if (SkipOp(".")) {
      stmt->targets.push_back(first);
      stmt->attribute = ExpectName();
    } else {
      stmt->targets.push_back(first);
      while (SkipOp(",")) {
        if (IsOp("=")) break;
        stmt->targets.push_back(ExpectName());
      }
    }
    if (SkipOp("=")) {
      stmt->expr = ParseTuple(true);
      ExpectBlockEnd();
      return stmt;
    }
    if (stmt->targets.size() != 1 || !stmt->attribute.empty()) Fail("expected '='");
    stmt->kind = Stmt::kSetBlock;
    stmt->expr = ParseFilterChain(false);
    ExpectBlockEnd();
    stmt->body = ParseBody({"endset"});
    Next();
    ExpectBlockEnd();
    return stmt;
  }

  // `| f(x) | g` after a set block's name, or `f(x) | g` after {% filter %} (start_inline): a
  // chain applied to an empty literal, which the evaluator replaces by the block's output (null
  // when there is no chain).
  ExprPtr ParseFilterChain(bool start_inline) {
    ExprPtr node;
    bool first = start_inline;
    while (first ? Current().kind == Token::kName || IsOp("|") : IsOp("|")) {
      if (!first || IsOp("|")) ExpectOp("|");
      first = false;
      if (!node) {
        node = MakeExpr(Expr::kLiteral);
        node->literal = Value("");
      }
      node = ParseFilter(std::move(node));
    }
    return node;
  }

  std::unique_ptr<Stmt> ParseFilterBlock() {
    auto stmt = NewStmt(Stmt::kFilterBlock);
    stmt->expr = ParseFilterChain(true);
    if (!stmt->expr) Fail("expected a filter name");
    ExpectBlockEnd();
    stmt->body = ParseBody({"endfilter"});
    Next();
    ExpectBlockEnd();
    return stmt;
  }

  std::unique_ptr<Stmt> ParseWith() {
    auto stmt = NewStmt(Stmt::kWith);
    while (Current().kind != Token::kBlockEnd) {
      if (!stmt->assignments.empty()) ExpectOp(",");
      std::string name = ExpectName();
      ExpectOp("=");
      stmt->assignments.emplace_back(name, ParseExpression());
    }
    ExpectBlockEnd();
    stmt->body = ParseBody({"endwith"});
    Next();
    ExpectBlockEnd();
    return stmt;
  }

  std::unique_ptr<Stmt> ParseMacro() {
    auto stmt = NewStmt(Stmt::kMacro);
    stmt->name = ExpectName();
    ExpectOp("(");
    while (!SkipOp(")")) {
      if (!stmt->params.empty()) ExpectOp(",");
      if (SkipOp(")")) break;
      stmt->params.push_back(ExpectName());
      stmt->defaults.push_back(SkipOp("=") ? ParseExpression() : nullptr);
      if (!stmt->defaults.back() && stmt->defaults.size() > 1 &&
          stmt->defaults[stmt->defaults.size() - 2])
        Fail("non-default argument follows default argument");
    }
    ExpectBlockEnd();
    int saved = loop_depth_;
    loop_depth_ = 0;
    stmt->body = ParseBody({"endmacro"});
    loop_depth_ = saved;
    Next();
    ExpectBlockEnd();
    return stmt;
  }

  ExprPtr MakeExpr(Expr::Kind kind) const {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = Current().line;
    return expr;
  }
  ExprPtr Make(Expr::Kind kind, ExprPtr a, ExprPtr b = nullptr) const {
    ExprPtr expr = MakeExpr(kind);
    expr->args.push_back(std::move(a));
    if (b) expr->args.push_back(std::move(b));
    return expr;
  }

  // expression [, expression ...]: a tuple when there is a comma (parse_tuple).
  ExprPtr ParseTuple(bool with_condexpr, const std::vector<std::string>& extra_ends = {}) {
    auto is_end = [&] {
      const Token& t = Current();
      if (t.kind == Token::kVarEnd || t.kind == Token::kBlockEnd || t.kind == Token::kEof)
        return true;
      if (IsOp(")")) return true;
      for (const auto& end : extra_ends)
        if (t.kind == Token::kName && t.value == end) return true;
      return false;
    };
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (is_end()) break;
      items.push_back(with_condexpr ? ParseExpression() : ParseOr());
      if (IsOp(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (items.empty()) Fail("expected an expression, got " + Describe(Current()));
      return std::move(items[0]);
    }
    ExprPtr tuple = MakeExpr(Expr::kTuple);
    tuple->args = std::move(items);
    return tuple;
  }

  ExprPtr ParseExpression() {
    DepthGuard guard(this);
    ExprPtr expr = ParseOr();
    while (SkipName("if")) {
      ExprPtr condition = ParseOr();
      ExprPtr otherwise = SkipName("else") ? ParseExpression() : nullptr;
      ExprPtr node = MakeExpr(Expr::kConditional);
      node->args.push_back(std::move(condition));
      node->args.push_back(std::move(expr));
      node->args.push_back(std::move(otherwise));
      expr = std::move(node);
    }
    return expr;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (SkipName("or")) left = Make(Expr::kOr, std::move(left), ParseAnd());
    return left;
  }
  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (SkipName("and")) left = Make(Expr::kAnd, std::move(left), ParseNot());
    return left;
  }
  ExprPtr ParseNot() {
    DepthGuard guard(this);
    if (SkipName("not")) return Make(Expr::kNot, ParseNot());
    return ParseCompare();
  }
  ExprPtr ParseCompare() {
    ExprPtr first = ParseMath1();
    ExprPtr node;
    while (true) {
      std::string op;
      if (Current().kind == Token::kOp &&
          (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">="))) {
        op = Current().value;
        Next();
      } else if (SkipName("in")) {
        op = "in";
      } else if (IsName("not") && Look().kind == Token::kName && Look().value == "in") {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!node) {
        node = MakeExpr(Expr::kCompare);
        node->args.push_back(std::move(first));
      }
      node->ops.push_back(op);
      node->args.push_back(ParseMath1());
    }
    return node ? std::move(node) : std::move(first);
  }
  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Current().value;
      Next();
      ExprPtr node = Make(Expr::kBinary, std::move(left), ParseConcat());
      node->name = op;
      left = std::move(node);
    }
    return left;
  }
  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (SkipOp("~")) {
      ExprPtr node = Make(Expr::kBinary, std::move(left), ParseMath2());
      node->name = "~";
      left = std::move(node);
    }
    return left;
  }
  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Current().value;
      Next();
      ExprPtr node = Make(Expr::kBinary, std::move(left), ParsePow());
      node->name = op;
      left = std::move(node);
    }
    return left;
  }
  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (SkipOp("**")) {
      ExprPtr node = Make(Expr::kBinary, std::move(left), ParseUnary(true));
      node->name = "**";
      left = std::move(node);
    }
    return left;
  }
  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      std::string op = Current().value;
      Next();
      node = Make(Expr::kNegate, ParseUnary(false));
      node->name = op;
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token& token = Current();
    ExprPtr node;
    if (token.kind == Token::kName) {
      const std::string& v = token.value;
      if (v == "true" || v == "True" || v == "false" || v == "False") {
        node = MakeExpr(Expr::kLiteral);
        node->literal = Value(v == "true" || v == "True");
      } else if (v == "none" || v == "None") {
        node = MakeExpr(Expr::kLiteral);
        node->literal = Value::None();
      } else {
        node = MakeExpr(Expr::kName);
        node->name = v;
      }
      Next();
    } else if (token.kind == Token::kString) {
      node = MakeExpr(Expr::kLiteral);
      std::string text;
      while (Current().kind == Token::kString) {  // 'a' 'b' is 'ab', as in Python
        text += Current().value;
        Next();
      }
      node->literal = Value(text);
    } else if (token.kind == Token::kInt || token.kind == Token::kFloat) {
      node = MakeExpr(Expr::kLiteral);
      node->literal = token.number;
      Next();
    } else if (SkipOp("(")) {
      if (SkipOp(")")) {
        node = MakeExpr(Expr::kTuple);
      } else {
        node = ParseTuple(true);
        ExpectOp(")");
      }
    } else if (IsOp("[")) {
      node = MakeExpr(Expr::kList);
      Next();
      while (!SkipOp("]")) {
        if (!node->args.empty()) ExpectOp(",");
        if (SkipOp("]")) break;
        node->args.push_back(ParseExpression());
      }
    } else if (IsOp("{")) {
      node = MakeExpr(Expr::kDict);
      Next();
      while (!SkipOp("}")) {
        if (!node->args.empty()) ExpectOp(",");
        if (SkipOp("}")) break;
        node->args.push_back(ParseExpression());
        ExpectOp(":");
        node->args.push_back(ParseExpression());
      }
    } else {
      Fail("unexpected " + Describe(token));
    }
    return node;
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        Next();
        if (Current().kind == Token::kName) {
          ExprPtr attr = Make(Expr::kGetAttr, std::move(node));
          attr->name = Current().value;
          Next();
          node = std::move(attr);
        } else if (Current().kind == Token::kInt) {
          ExprPtr index = MakeExpr(Expr::kLiteral);
          index->literal = Current().number;
          Next();
          node = Make(Expr::kGetItem, std::move(node), std::move(index));
        } else {
          Fail("expected name or number");
        }
      } else if (IsOp("[")) {
        Next();
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(Make(Expr::kCall, std::move(node)));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    ExprPtr start, stop, step;
    bool slice = false;
    if (!IsOp(":")) start = ParseExpression();
    if (SkipOp(":")) {
      slice = true;
      if (!IsOp("]") && !IsOp(":")) stop = ParseExpression();
      if (SkipOp(":") && !IsOp("]")) step = ParseExpression();
    }
    if (IsOp(",")) throw Error(Error::kUnsupported, Current().line, "a tuple subscript a[x, y]");
    ExpectOp("]");
    if (!slice) return Make(Expr::kGetItem, std::move(node), std::move(start));
    ExprPtr expr = Make(Expr::kSlice, std::move(node));
    expr->args.push_back(std::move(start));
    expr->args.push_back(std::move(stop));
    expr->args.push_back(std::move(step));
    return expr;
  }

  // (args, name=value) appended to node's args/kwargs.
  ExprPtr ParseCall(ExprPtr node) {
    ExpectOp("(");
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (SkipOp(")")) break;
      if (IsOp("*") || IsOp("**"))
        throw Error(Error::kUnsupported, Current().line, "*args or **kwargs in a call");
      if (Current().kind == Token::kName && Look().kind == Token::kOp && Look().value == "=") {
        std::string key = Current().value;
        Next();
        Next();
        node->kwargs.emplace_back(key, ParseExpression());
      } else {
        if (!node->kwargs.empty()) Fail("positional argument follows keyword argument");
        node->args.push_back(ParseExpression());
      }
    }
    return node;
  }

  ExprPtr ParseFilter(ExprPtr node) {
    ExprPtr filter = Make(Expr::kFilter, std::move(node));
    filter->name = ExpectName();
    while (IsOp(".")) {
      Next();
      filter->name += "." + ExpectName();
    }
    if (IsOp("(")) filter = ParseCall(std::move(filter));
    return filter;
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (SkipOp("|")) {
        node = ParseFilter(std::move(node));
      } else if (SkipName("is")) {
        ExprPtr test = Make(Expr::kTest, std::move(node));
        test->negated = SkipName("not");
        test->name = ExpectName();
        while (IsOp(".")) {
          Next();
          test->name += "." + ExpectName();
        }
        const Token& t = Current();
        if (IsOp("(")) {
          test = ParseCall(std::move(test));
        } else if ((t.kind == Token::kName || t.kind == Token::kString || t.kind == Token::kInt ||
                    t.kind == Token::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) Fail("You cannot chain multiple tests with is");
          test->args.push_back(ParsePostfix(ParsePrimary()));
        }
        node = std::move(test);
      } else if (IsOp("(")) {
        node = ParseCall(Make(Expr::kCall, std::move(node)));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body ParseTemplate(std::string_view source, const LexOptions& options) {
  if (!IsValidUtf8(source)) throw Error(Error::kSyntax, 0, "the template is not valid UTF-8");
  return Parser(Tokenize(source, options)).ParseAll();
}

}  // namespace crucible::jinja
