// The Jinja interpreter of chat templates (sft/jinja.h): renderings equal to what transformers'
// environment (jinja2 3.1.6: trim_blocks, lstrip_blocks, loopcontrols, its tojson) renders for
// the same template and variables (the expected strings were produced by it), and the failures:
// a construct it does not implement is kUnsupported naming it, bad syntax is kSyntax, the
// template's raise_exception is kRaised, and runaway templates stop at a limit, never crash.
#include "sft/jinja.h"

#include <gtest/gtest.h>

#include <string>

namespace crucible::jinja {
namespace {

struct Case {
  const char* name;
  const char* source;
  const char* variables;  // JSON
  const char* expected;
};

// Generated once by rendering each source with transformers.utils.chat_template_utils.
// _compile_jinja_template(source).render(**variables) (transformers 5.24, jinja2 3.1.6).
const Case kCases[] = {
    {"lstrip_and_trim_blocks", "a\n  {% if true %}\n  x\n  {% endif %}\nb\n", "{}", "a\n  x\nb"},
    {"minus_strips_both_sides", "a  \n {%- if true -%} \n x \n {%- endif -%}\n b", "{}", "axb"},
    {"plus_keeps_leading_space", "  {%+ if true %}x{% endif %}|\n  {% if true +%}\ny{% endif %}",
     "{}", "  x|\n\ny"},
    {"variables_are_not_lstripped", "  {{ 'v' }}\n  {% if true %}w{% endif %}", "{}", "  v\nw"},
    {"comments_trim_and_lstrip", "  {# c #}\nA{#- c -#}  B {#+ c #}\nC", "{}", "AB C"},
    {"raw_block", "{% raw %}{{ not a tag }}{% endraw %}|{%- raw -%}  x  {%- endraw %}", "{}",
     "{{ not a tag }}|x"},
    {"crlf_and_trailing_newline", "x\r\ny\rz\n", "{}", "x\ny\nz"},
    {"block_after_text_on_same_line_keeps_spaces", "x  {% if true %}y{% endif %}", "{}", "x  y"},
    {"arithmetic",
     "{{ 1/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1e20 }} {{ 1.5e-5 }} {{ 0.1+0.2 "
     "}} {{ 3/1 }}",
     "{}", "0.5 3 -4 2 1024 1e+20 1.5e-05 0.30000000000000004 3.0"},
    {"python_str_and_repr",
     "{{ [1,'a',none,true,{'k':\"it's\"}] }} {{ (1,) }} {{ none }}|{{ missing }}|", "{}",
     "[1, 'a', None, True, {'k': \"it's\"}] (1,) None||"},
    {"string_escapes", "{{ 'a\\tb\\u00e9\\x41\\d\\101' }}", "{}",
     "a\tb\xc3"
     "\xa9"
     "A\\dA"},
    {"unicode_indexing",
     "{{ 'h\xc3"
     "\xa9"
     "llo'|length }}{{ 'h\xc3"
     "\xa9"
     "llo'[1] }}{{ 'h\xc3"
     "\xa9"
     "llo'[::-1] }}{{ [1,2,3,4,5][1:4:2] }}",
     "{}",
     "5\xc3"
     "\xa9"
     "oll\xc3"
     "\xa9"
     "h[2, 4]"},
    {"precedence",
     "{{ 'a' ~ 'b' | upper }}{{ -2 ** 2 }}{{ not true == false }}{{ 1 if 0 else 2 if 0 else 3 }}{{ "
     "1 < 2 < 3 }}{{ 'x' not in ['y'] }}",
     "{}", "aB4True3TrueTrue"},
    {"and_or_return_operands",
     "{{ x or 'default' }}|{{ x and 'yes' }}|{{ 1 and 2 }}|{{ 0 or none }}", "{\"x\": \"\"}",
     "default||2|None"},
    {"tests",
     "{{ 'x' is string }}{{ true is number }}{{ true is integer }}{{ u is defined }}{{ none is "
     "none }}{{ 9 is divisibleby 3 }}{{ x is not defined }}",
     "{}", "TrueTrueFalseFalseTrueTrueTrue"},
    {"loop_variables",
     "{% for a in [1,2,3] if a > 1 %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
     "loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.cycle('x','y') }};{% else %}empty{% "
     "endfor %}",
     "{}", "102TrueFalse2x;211FalseTrue2y;"},
    {"loop_scope",
     "{% set x = 0 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }}|{% if true "
     "%}{% set y = 5 %}{% endif %}{{ y }}",
     "{}", "[0][0]0|5"},
    {"namespace_carries_out_of_loops",
     "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set "
     "ns.s = ns.s ~ m.role %}{% endfor %}{{ ns.n }}{{ ns.s }}",
     "{\"messages\": [{\"role\": \"user\"}, {\"role\": \"assistant\"}]}", "2userassistant"},
    {"break_continue",
     "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% "
     "endif %}{{ i }}{% endfor %}",
     "{}", "02"},
    {"macros",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ "
     "greet('B', '?') }} {{ greet(name='C', punct='.') }}",
     "{}", "Hi A! Hi B? Hi C."},
    {"set_block_filter_block_with",
     "{%- set s %}  S  {% endset -%}[{{ s }}]{% set t | trim %}  t  {% endset %}[{{ t }}]{% filter "
     "upper %}up{% endfilter %}{% with a = 1 %}{{ a }}{% endwith %}{{ a is defined }}",
     "{}", "[  S  ][t]UP1False"},
    {"tuple_unpacking",
     "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "{\"d\": {\"b\": 2, \"a\": 1}}", "12b=2;a=1;"},
    {"string_methods",
     "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ ' a  b '.split() }}|{{ ' a  b "
     "'.split(none, 1) }}|{{ 'a,b'.split(',') }}|{{ 'a</think>b'.split('</think>')[-1] }}|{{ "
     "'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'h\xc3"
     "\xa9"
     "\xc3"
     "\xa9"
     "'.find('\xc3"
     "\xa9"
     "') }}|{{ 'aaa'.replace('a', 'b', 2) }}",
     "{}", "x|hi|['a', 'b']|['a', 'b ']|['a', 'b']|b|TrueTrue|1|bba"},
    {"filters",
     "{{ '  x  '|trim }}|{{ u|default('d') }}|{{ ''|default('d', true) }}|{{ [3,1,2]|first }}{{ "
     "[3,1,2]|last }}|{{ ['a','b']|join(', ') }}|{{ 'hello wORLD-x'|title }}|{{ ['b','A','c']|sort "
     "}}|{{ [1,2,2]|unique|list }}|{{ '42'|int }}{{ 'x'|int }}|{{ 2.5|round }}{{ 3.5|round }}|{{ "
     "'a\\nb'|indent(2, true) }}|{{ '<&>'|e }}",
     "{}", "x|d|d|32|a, b|Hello World-X|['A', 'b', 'c']|[1, 2]|420|2.04.0|  a\n  b|&lt;&amp;&gt;"},
    {"select_map",
     "{{ m|map(attribute='role')|list }}|{{ m|selectattr('role','equalto','user')|list|length "
     "}}|{{ m|rejectattr('role','equalto','user')|map(attribute='content')|join }}|{{ "
     "[1,2,3]|select('odd')|list }}",
     "{\"m\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": "
     "\"b\"}]}",
     "['user', 'assistant']|1|b|[1, 3]"},
    {"tojson_is_transformers",
     "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ '\xc3"
     "\xa9"
     "\\u2028'|tojson }}|{{ '\xc3"
     "\xa9"
     "'|tojson(ensure_ascii=true) }}|{{ 1.0|tojson }}",
     "{\"d\": {\"z\": [1, null, true], \"a\": \"\\\"q\\\"\\n\"}}",
     "{\"z\": [1, null, true], \"a\": \"\\\"q\\\"\\n\"}|{\n  \"z\": [\n    1,\n    null,\n    "
     "true\n  ],\n  \"a\": \"\\\"q\\\"\\n\"\n}|\"\xc3"
     "\xa9"
     "\xe2"
     "\x80"
     "\xa8"
     "\"|\"\\u00e9\"|1.0"},
    {"dict_access",
     "{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d['a'] }}{{ d.a }}{{ d.zz is defined }}{{ "
     "d.keys()|list }}{{ none.attr }}",
     "{\"d\": {\"b\": 2, \"a\": 1}}", "1dflt11False['b', 'a']"},
};

std::string Render(const std::string& source, const std::string& variables = "{}",
                   RenderLimits limits = {}) {
  return Template::Parse(source).Render(nlohmann::ordered_json::parse(variables), limits);
}

TEST(JinjaTest, RendersAsTransformersJinjaEnvironmentDoes) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(Render(c.source, c.variables), c.expected);
  }
}

Error::Kind KindOf(const std::string& source, const std::string& variables = "{}",
                   RenderLimits limits = {}) {
  try {
    Render(source, variables, limits);
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error for " << source;
  return Error::kRuntime;
}

std::string MessageOf(const std::string& source) {
  try {
    Render(source);
  } catch (const Error& e) {
    return std::string(e.what()) + " (line " + std::to_string(e.line()) + ")";
  }
  return "no error";
}

TEST(JinjaTest, IntegerArithmeticIsExactAndStopsAt64Bits) {
  EXPECT_EQ(Render("{{ 1 + 1 }} {{ 2 * 3 }} {{ 5 - 7 }} {{ 2 ** 62 }} {{ (-2) ** 63 }} {{ "
                   "-9223372036854775807 - 1 }}"),
            "2 6 -2 4611686018427387904 -9223372036854775808 -9223372036854775808");
  EXPECT_EQ(KindOf("{{ 2 ** 63 }}"), Error::kUnsupported);
  EXPECT_EQ(KindOf("{{ 9223372036854775807 + 1 }}"), Error::kUnsupported);
}

TEST(JinjaTest, AConstructItDoesNotImplementIsUnsupportedAndNamed) {
  EXPECT_EQ(KindOf("{% call m() %}x{% endcall %}"), Error::kUnsupported);
  EXPECT_NE(MessageOf("a\n{% include 'x' %}").find("statement '{% include %}' (line 2)"),
            std::string::npos)
      << MessageOf("a\n{% include 'x' %}");
  EXPECT_NE(MessageOf("{{ [1,2]|batch(1) }}").find("filter 'batch'"), std::string::npos);
  EXPECT_NE(MessageOf("{{ strftime_now('%d') }}").find("function 'strftime_now()'"),
            std::string::npos);
  EXPECT_NE(MessageOf("{{ 'a{}'.format(1) }}").find("method str.format()"), std::string::npos);
  EXPECT_NE(MessageOf("{{ 'é'|upper }}").find("upper() of non-ASCII text"), std::string::npos);
  EXPECT_EQ(KindOf("{{ 10000000000 * 10000000000 }}"),
            Error::kUnsupported);  // Python's ints are unbounded
  EXPECT_EQ(KindOf("{% for x in y recursive %}{% endfor %}"), Error::kUnsupported);
  EXPECT_EQ(KindOf("{{ x is filter }}"), Error::kUnsupported);
}

TEST(JinjaTest, BadSyntaxIsASyntaxErrorWithItsLine) {
  EXPECT_EQ(KindOf("{% for x in y %}"), Error::kSyntax);
  EXPECT_EQ(KindOf("{{ 1 + }}"), Error::kSyntax);
  EXPECT_EQ(KindOf("{% endif %}"), Error::kSyntax);
  EXPECT_EQ(KindOf("{% break %}"), Error::kSyntax);  // outside a loop
  EXPECT_EQ(KindOf("{{ (1 }}"), Error::kSyntax);
  EXPECT_EQ(KindOf("{# never closed"), Error::kSyntax);
  EXPECT_EQ(KindOf("{{ 'a\\x4' }}"), Error::kSyntax);
  EXPECT_NE(MessageOf("x\ny\n{% if %}").find("(line 3)"), std::string::npos)
      << MessageOf("x\ny\n{% if %}");
  EXPECT_EQ(KindOf(std::string("{{ '\xff' }}")), Error::kSyntax);  // not UTF-8
}

TEST(JinjaTest, RuntimeErrorsAreTheOnesJinjaRaises) {
  EXPECT_EQ(MessageOf("{{ x.y }}"), "'x' is undefined (line 1)");
  EXPECT_EQ(KindOf("{{ 'a' + 1 }}"), Error::kRuntime);
  EXPECT_EQ(KindOf("{{ 1 // 0 }}"), Error::kRuntime);
  EXPECT_EQ(KindOf("{{ 1 < 'a' }}"), Error::kRuntime);
  EXPECT_EQ(KindOf("{% for x in 5 %}{% endfor %}"), Error::kRuntime);
  EXPECT_EQ(KindOf("{{ 1 in 'abc' }}"), Error::kRuntime);
  EXPECT_EQ(KindOf("{% set d = {} %}{% set d.x = 1 %}"), Error::kRuntime);  // not a namespace
  EXPECT_EQ(KindOf("{{ bos_token + 'x' }}"), Error::kRuntime);              // undefined + str
  try {
    Render("{{ raise_exception('Only user and assistant roles are supported!') }}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::kRaised);
    EXPECT_STREQ(e.what(), "Only user and assistant roles are supported!");
  }
}

TEST(JinjaTest, RunawayTemplatesStopAtALimitInsteadOfCrashing) {
  RenderLimits limits;
  limits.max_steps = 100000;
  EXPECT_EQ(
      KindOf("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
             "{}", limits),
      Error::kLimit);
  EXPECT_EQ(KindOf("{{ range(100001) }}"), Error::kLimit);  // the sandbox's MAX_RANGE
  limits = {};
  limits.max_output_bytes = 1000;
  EXPECT_EQ(KindOf("{% for i in range(1000) %}xx{% endfor %}", "{}", limits), Error::kLimit);
  EXPECT_EQ(KindOf("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), Error::kLimit);  // recursion
  EXPECT_EQ(KindOf("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
            Error::kLimit);
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_EQ(KindOf(nested), Error::kLimit);
  EXPECT_EQ(KindOf("{{ 'x' * 100000000 }}"), Error::kLimit);
}

TEST(JinjaTest, FloatsPrintAsPythonReprs) {
  EXPECT_EQ(PythonFloatRepr(1.0), "1.0");
  EXPECT_EQ(PythonFloatRepr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(PythonFloatRepr(1e-4), "0.0001");
  EXPECT_EQ(PythonFloatRepr(1.5e-5), "1.5e-05");
  EXPECT_EQ(PythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PythonFloatRepr(1e300 * 1e300), "inf");
}

TEST(JinjaTest, PythonStripUsesPythonsWhitespace) {
  EXPECT_EQ(PythonStrip("\u3000\u00a0 x \x1c\u0085", nullptr, true, true), "x");
  EXPECT_EQ(PythonStrip("\u200bx", nullptr, true, true),
            "\u200bx");  // a zero-width space is not whitespace
  std::string chars = "é";
  EXPECT_EQ(PythonStrip("ééxé", &chars, true, false), "xé");
}

}  // namespace
}  // namespace crucible::jinja
