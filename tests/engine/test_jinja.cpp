// The Jinja engine against jinja2 3.1 as transformers configures it. The expected strings of
// the feature table were produced by Python jinja2 through tests/data/chat_templates/
// render_chat.py (trim_blocks, lstrip_blocks, sandbox, transformers' tojson); real model
// templates are compared live in test_chat_templates.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/jinja.h"

namespace moebatch::jinja {
namespace {

// 2024-07-26, a Friday: what strftime_now sees in these tests.
const std::chrono::system_clock::time_point kDate =
    std::chrono::sys_days{std::chrono::year{2024} / 7 / 26};

std::string render(std::string_view source, const std::string& vars_json = "{}",
                   const Limits& limits = {}) {
  std::vector<std::pair<std::string, Value>> vars;
  const auto parsed = nlohmann::ordered_json::parse(vars_json);
  for (const auto& [k, v] : parsed.items()) {
    vars.emplace_back(k, Value::from_json(v));
  }
  return Template::parse(source, limits).render(vars, kDate);
}

/// The error of parsing and rendering `source`; "" when both succeed.
std::string error_of(std::string_view source, const std::string& vars_json = "{}",
                     const Limits& limits = {}) {
  try {
    render(source, vars_json, limits);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(call, substring)                                                \
  do {                                                                               \
    const std::string err_ = (call);                                                 \
    EXPECT_NE(err_.find(substring), std::string::npos) << "error: '" << err_ << "'"; \
  } while (0)

struct Case {
  const char* name;
  const char* source;
  const char* vars;
  const char* expected;
};

const Case kCases[] = {
    {"TrimAndLstripBlocks",
     "{% if true %}\n  yes\n{% endif %}\n  {% if true %}\n  b\n  {% endif %}\nend\n",
     R"json({})json", "  yes\n  b\nend"},
    {"DashStripsAllWhitespace", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c",
     R"json({})json", "abc"},
    {"PlusKeepsLeadingWhitespace", "x\n    {%+ if true %}y{% endif %}\n  {{ 'v' }}\n",
     R"json({})json", "x\n    y  v"},
    {"CommentsAreDropped", "A {# one #}\n  {# two #}\nB{#- three -#}  C", R"json({})json", "A BC"},
    {"RawBlock", "{% raw %}{{ x }}{% if %}{% endraw %}!", R"json({})json", "{{ x }}{% if %}!"},
    {"ConcatAndStr", "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ missing }}", R"json({})json",
     "a1NoneTrue1.5"},
    {"LoopVariables",
     "{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 "
     "}}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     R"json({})json", "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
    {"LoopPrevNextItem",
     "{% for x in 'abc' %}{{ loop.previtem|default('^') }}{{ x }}{{ loop.nextitem|default('$') }} "
     "{% endfor %}",
     R"json({})json", "^ab abc bc$ "},
    {"LoopCycleAndNesting",
     "{% for i in range(4) %}{{ loop.cycle('a', 'b') }}{% endfor %} {% for a in [1,2] %}{% for b "
     "in [1,2,3] %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}",
     R"json({})json", "abab 1231;1232;"},
    {"ForIfFilterAndElse",
     "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }},{% else %}none{% endfor %}|{% "
     "for x in [] %}x{% else %}empty{% endfor %}",
     R"json({})json", "15,35,55,75,95,|empty"},
    {"BreakAndContinue",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% "
     "endif %}{{ x }}{% endfor %}",
     R"json({})json", "0134"},
    {"LoopOverDictAndUnpack",
     "{% for k in d %}{{ k }}{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} "
     "{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}",
     R"json({"d": {"b": 1, "a": 2}})json", "ba b=1;a=2; b1a2"},
    {"SetInLoopDoesNotLeak",
     "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}{% if true "
     "%}{% set y = 5 %}{% endif %}{{ y }}",
     R"json({})json", "2315"},
    {"NamespaceAttributes",
     "{% set ns = namespace(n=0, s='', found=false) %}{% for i in range(4) %}{% set ns.n = ns.n + "
     "i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ ns.found }} {{ ns.missing "
     "is defined }} {{ ns['n'] }}",
     R"json({})json", "6 0123 False False 6"},
    {"MacroArguments",
     "{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) "
     "}}{{ m(a=3, c=4) }}{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, k=3) }}",
     R"json({})json", "[1BNone][12None][3B4](1, 2){'k': 3}"},
    {"MacroSeesTopLevelVariables",
     "{% set g = 'G' %}{% macro m() %}{{ g }}{{ messages|length }}{% endmacro %}{{ m() }}",
     R"json({"messages": [1, 2]})json", "G2"},
    {"CallBlocks",
     "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') "
     "%}hi{% endcall %}{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro "
     "%}{% call(v) each([1, 2]) %}<{{ v }}>{% endcall %}",
     R"json({})json", "<b>hi</b><1><2>"},
    {"FilterSetAndGenerationBlocks",
     "{% filter upper %}abc{{ 'd' }}{% endfilter %}{% set s %}  Hello {{ 'W' }}  {% endset %}[{{ "
     "s|trim }}]{% set t | upper %}x{% endset %}{{ t }}{% generation %}gen{% endgeneration %}",
     R"json({})json", "ABCD[Hello W]Xgen"},
    {"WithBlock", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}",
     R"json({})json", "3False"},
    {"Tests",
     "{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping "
     "}}{{ [] is iterable }}{{ 'a' is sequence }}{{ 1 is number }}{{ true is number }}{{ 1 is "
     "integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is true }}{{ "
     "false is false }}{{ 0 is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 2 "
     "is in [1, 2] }}{{ 'a' is eq 'a' }}{{ 1 is equalto 2 }}{{ 1 is ne 2 }}{{ 3 is gt 2 }}{{ "
     "missing is iterable }}{{ 'ab' is lower }}{{ x is not none }}{{ not x is none }}",
     R"json({"x": 1})json",
     "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueFalseTr"
     "ueTrueTrueTrueTrueTrue"},
    {"Arithmetic",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ "
     "2 ** -1 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 'ab' * 3 }} {{ "
     "2 * [0] }} {{ [1] + [2] }} {{ true + 1 }} {{ -(3) }} {{ +4 }} {{ '%s=%d' % ('a', 3) }}",
     R"json({})json", "3 -4 1 2 3.5 2.0 1024 0.5 7 9 3.0 0.5 ababab [0, 0] [1, 2] 2 -3 4 a=3"},
    {"ComparisonsAndLogic",
     "{{ 1 == 1.0 }} {{ 'b' > 'a' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'x' in 'xyz' }} {{ 'q' not "
     "in 'xyz' }} {{ 'a' in {'a': 1} }} {{ 1 in [1.0] }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == "
     "{'a': 1} }} {{ not false }} {{ 0 or 'd' }} {{ 1 and 2 }} {{ '' and 'x' }} {{ none == none }} "
     "{{ missing == none }}",
     R"json({})json", "True True True False True True True True True True True d 2  True False"},
    {"Precedence",
     "{{ 1 + [1, 2]|length }} {{ -2|abs }} {{ 'a' ~ 'b'|upper }} {{ not 1 == 2 }} {{ 2 ** 3 ** 2 "
     "}} {{ -2 ** 2 }} {{ 1 if false else 2 if false else 3 }}",
     R"json({})json", "3 2 aB True 64 4 3"},
    {"InlineIf", "{{ 'y' if x else 'n' }}{{ 'y' if none else 'n' }}[{{ 'only' if false }}]",
     R"json({"x": 1})json", "yn[]"},
    {"Literals",
     "{{ [1, 'a', none, true, 1.5] }} {{ {'k': [1, (2, 3)], 'j': {'x': none}} }} {{ (1,) }} {{ () "
     "}} {{ 'it\\'s' }} {{ \"q\\\"\" }} {{ 'ab' 'cd' }} {{ 1_000 }} {{ 2.5e3 }} {{ True }}{{ False "
     "}}{{ None }}",
     R"json({})json",
     "[1, 'a', None, True, 1.5] {'k': [1, (2, 3)], 'j': {'x': None}} (1,) () it's q\" abcd 1000 "
     "2500.0 TrueFalseNone"},
    {"StringEscapes", "{{ 'a\\tb\\x41\\u00e9\\\\d\\q' }}|{{ '\\n'|length }}", R"json({})json",
     "a\tbAé\\d\\q|1"},
    {"ReprOfStrings", "{{ ['it\\'s', 'q\"', 'both\\'\"', 'a\\nb', 'tab\\t', 'é', '\\x01'] }}",
     R"json({})json", "[\"it's\", 'q\"', 'both\\'\"', 'a\\nb', 'tab\\t', 'é', '\\x01']"},
    {"FloatRepr",
     "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 1.0 }} {{ 123456789.0 }} {{ "
     "10 / 4 }} {{ [0.5, -0.0] }} {{ 1.5e300 * 1e10 }}",
     R"json({})json",
     "0.30000000000000004 1e+16 1000000000000000.0 1e-05 0.0001 1.0 123456789.0 2.5 [0.5, -0.0] "
     "inf"},
    {"Slicing",
     "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1,2,3,4][1:] }} {{ [1,2,3,4][:-1] }} {{ "
     "[1,2,3,4][::2] }} {{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'abc'[-1] }} {{ [1,2,3][5:] }} {{ "
     "(1,2,3)[1:] }}",
     R"json({})json", "el olleh [2, 3, 4] [1, 2, 3] [1, 3] é él c [] (2, 3)"},
    {"AttributeAndItemAccess",
     "{{ d.a }}{{ d['a'] }}{{ d.missing is defined }}{{ l[0].k }}{{ l[5] is defined }}{{ "
     "l[-1]['k'] }}{{ l.0.k }}{{ s.foo is defined }}{{ none.x is defined }}",
     R"json({"d": {"a": 1}, "l": [{"k": "v"}], "s": "str"})json", "11FalsevFalsevvFalseFalse"},
    {"ToJson",
     "{{ v|tojson }}\n{{ v|tojson(indent=2) }}\n{{ v|tojson(ensure_ascii=True) }}\n{{ "
     "v|tojson(separators=(',', ':')) }}\n{{ v|tojson(sort_keys=true) }}\n{{ "
     "v|tojson(indent='\\t') }}\n{{ 'x'|tojson }}{{ 1.5|tojson }}{{ none|tojson }}{{ (1, 2)|tojson "
     "}}",
     R"json({"v": {"b": [1, 2.5, "é\"\n\u0001😀", null, true], "a": {}, "c": []}})json",
     "{\"b\": [1, 2.5, \"é\\\"\\n\\u0001😀\", null, true], \"a\": {}, \"c\": []}\n{\n  \"b\": [\n   "
     " 1,\n    2.5,\n    \"é\\\"\\n\\u0001😀\",\n    null,\n    true\n  ],\n  \"a\": {},\n  \"c\": "
     "[]\n}\n{\"b\": [1, 2.5, \"\\u00e9\\\"\\n\\u0001\\ud83d\\ude00\", null, true], \"a\": {}, "
     "\"c\": []}\n{\"b\":[1,2.5,\"é\\\"\\n\\u0001😀\",null,true],\"a\":{},\"c\":[]}\n{\"a\": {}, "
     "\"b\": [1, 2.5, \"é\\\"\\n\\u0001😀\", null, true], \"c\": []}\n{\n\t\"b\": "
     "[\n\t\t1,\n\t\t2.5,\n\t\t\"é\\\"\\n\\u0001😀\",\n\t\tnull,\n\t\ttrue\n\t],\n\t\"a\": "
     "{},\n\t\"c\": []\n}\n\"x\"1.5null[1, 2]"},
    {"StringMethods",
     "{{ 'x,y,,z'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'a b "
     "c'.split(None, 1) }}|{{ 'xxaxx'.strip('x') }}|{{ '  p '.lstrip() }}|{{ ' p  '.rstrip() }}|{{ "
     "'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}|{{ 'hello world'.title() "
     "}}|{{ 'hELLO'.capitalize() }}|{{ 'abc'.upper() }}{{ 'ABC'.lower() }}|{{ 'aXbX'.replace('X', "
     "'-') }}{{ 'aXbX'.replace('X', '-', 1) }}|{{ 'héllo'.find('l') }}{{ 'hello'.rfind('l') }}{{ "
     "'hello'.find('z') }}{{ 'hello'.count('l') }}|{{ '{} and {}'.format(1, 'b') }}{{ "
     "'{0}{0}{n}'.format('x', n='y') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb\\r\\nc'.splitlines() "
     "}}|{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'Ab'.islower() }}",
     R"json({})json",
     "['x', 'y', '', 'z']|['a', 'b']|['a b', 'c']|['a', 'b c']|a|p | p|TrueTrue|Hello "
     "World|Hello|ABCabc|a-b-a-bX|23-12|1 and bxxy|a-b|['a', 'b', 'c']|TrueTrueFalse"},
    {"CollectionFilters",
     "{{ [3,1,2]|sort }}{{ ['b','A','c']|sort }}{{ [3,1,2]|sort(reverse=true) }}{{ "
     "users|sort(attribute='name', reverse=true)|map(attribute='name')|list }}|{{ "
     "users|map(attribute='name')|join(', ') }}|{{ "
     "users|selectattr('admin')|map(attribute='name')|list }}{{ "
     "users|rejectattr('admin')|list|length }}{{ users|selectattr('name', 'equalto', "
     "'bob')|list|length }}|{{ [1,2,3]|select('odd')|list }}{{ [1,2,3]|reject('odd')|list }}{{ [0, "
     "1, '', 'a']|select|list }}|{{ ['a','B','A','b']|unique|list }}{{ [1,2]|reverse|list }}{{ "
     "'abc'|reverse }}|{{ {'b':1,'A':2,'a':3}|dictsort }}{{ {'b':1,'a':2}|dictsort(by='value', "
     "reverse=true) }}|{{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ []|first is defined }}|{{ "
     "users|map(attribute='missing', default='-')|join }}|{{ ['a','b']|map('upper')|join }}{{ [1, "
     "2]|map('string')|list }}|{{ [1,2,3]|sum }}{{ users|map(attribute='admin')|select|list|length "
     "}}{{ [3,1,2]|min }}{{ [3,1,2]|max }}{{ ['b','A']|min }}",
     R"json({"users": [{"name": "ann", "admin": true}, {"name": "bob", "admin": false}, {"name": "cy", "admin": true}]})json",
     "[1, 2, 3]['A', 'b', 'c'][3, 2, 1]['cy', 'bob', 'ann']|ann, bob, cy|['ann', 'cy']11|[1, "
     "3][2][1, 'a']|['a', 'B'][2, 1]cba|[('A', 2), ('a', 3), ('b', 1)][('a', 2), ('b', "
     "1)]|13False|---|AB['1', '2']|6213A"},
    {"ScalarFilters",
     "{{ 'x'|default('d') }}{{ missing|default('d') }}{{ ''|default('e', true) }}{{ none|d('n') "
     "}}|{{ 'abc'|length }}{{ [1,2]|count }}{{ {'a': 1}|length }}|{{ -3|abs }}{{ -2.5|abs }}|{{ "
     "2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 7|round }} {{ 2.1|round(0, 'ceil') }} "
     "{{ 2.9|round(method='floor') }}|{{ '42'|int + 1 }}{{ ' 7 '|int }}{{ '3.9'|int }}{{ 'abc'|int "
     "}}{{ 'abc'|int(5) }}{{ 4.7|int }}{{ '3.5'|float }}{{ 'x'|float }}|{{ 3|string ~ 'x' }}{{ "
     "'ab'|upper }}{{ 'AB'|lower }}{{ 'hello wORLD-foo(bar'|title }}{{ 'hELLO'|capitalize }}{{ "
     "'a-b-c'|replace('-', '+') }}{{ 'a-b-c'|replace('-', '', 1) }}|{{ '  x  '|trim }}{{ "
     "'xxyxx'|trim('x') }}|{{ 'a b  c'|wordcount }}|{{ '<a href=\"x\">&\\'</a>'|e }}{{ 'x'|safe "
     "}}|{{ '%s-%s'|format(1, 'b') }}|{{ d|attr('a') }}",
     R"json({"d": {"a": "A"}})json",
     "xdeNone|321|32.5|2.57 2.0 4.0 7 3.0 2.0|43730543.50.0|3xABabHello "
     "World-Foo(BarHelloa+b+cab-c|xy|3|&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;x|1-b|"},
    {"IndentFilter",
     "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, first=true) }}|{{ "
     "'x\\n\\ny'|indent(width='> ', blank=true) }}|{{ 'one\\n'|indent }}",
     R"json({})json", "a\n  b\n\n  c|  a\n  b|x\n> \n> y|one\n"},
    {"UndefinedIsLenient",
     "[{{ missing }}][{{ missing|length }}][{% for x in missing %}x{% endfor %}][{{ missing is "
     "iterable }}][{{ d.nope }}][{{ missing|upper }}][{{ missing|list }}][{{ missing|join }}][{{ "
     "missing ~ 'x' }}][{{ missing|trim }}][{{ missing|string }}][{{ 'a' in missing }}][{% if "
     "missing %}t{% else %}f{% endif %}]",
     R"json({"d": {}})json", "[][0][][True][][][[]][][x][][][False][f]"},
    {"Globals",
     "{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b='x') "
     "}}{{ dict({'z': 0}, y=1) }}{{ strftime_now('%Y-%m-%d|%d %b %Y|%B %A') }}",
     R"json({})json",
     "[0, 1, 2][1, 4, 7][5, 3, 1]{'a': 1, 'b': 'x'}{'z': 0, 'y': 1}2024-07-26|26 Jul 2024|July "
     "Friday"},
    {"DictMethods",
     "{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('a') }}{{ d.get('z', 'dz') }}{{ d.get('z') "
     "}}{{ d.items()|list }}{{ d.copy() }}",
     R"json({"d": {"b": 1, "a": 2}})json",
     "['b', 'a'][1, 2]2dzNone[('b', 1), ('a', 2)]{'b': 1, 'a': 2}"},
    {"TopLevelReassignment",
     "{% set messages = messages[1:] %}{{ messages|length }}{% set n = messages|length - 1 %}{{ n "
     "}}",
     R"json({"messages": [1, 2, 3]})json", "21"},
    {"ReprOfValues",
     "{{ {'é': 'ü', 1: none, 'l': [true, false]} }} {{ [1.0, 'x', [], {}] }} {{ d }}",
     R"json({"d": {"k": [1, {"z": "q"}]}})json",
     "{'é': 'ü', 1: None, 'l': [True, False]} [1.0, 'x', [], {}] {'k': [1, {'z': 'q'}]}"},
    {"ListMethods", "{{ [1, 2, 2].count(2) }}{{ ['a', 'b'].index('b') }}", R"json({})json", "21"},
    {"NestedMacroOutputIsString",
     "{% macro vis(c) %}{% if c is string %}{{ c }}{% else %}{% for p in c %}{{ p.text }}{% endfor "
     "%}{% endif %}{% endmacro %}{{ vis('s') }}|{{ vis([{'text': 'a'}, {'text': 'b'}]) }}|{{ "
     "vis('abc').endswith('bc') }}",
     R"json({})json", "s|ab|True"},
    {"TrailingNewlineDropped", "a\n\n", R"json({})json", "a\n"},
    {"CrLfNormalised", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", R"json({})json", "a\nb\nc"},
};

TEST(Jinja, FeaturesRenderAsJinja2) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    try {
      EXPECT_EQ(render(c.source, c.vars), c.expected);
    } catch (const InputError& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

TEST(Jinja, SyntaxErrorsCarryLineAndColumn) {
  const struct {
    const char* source;
    const char* expect;
  } cases[] = {
      {"ab\n{% if %}", "line 2:7: expected an expression"},
      {"{{ 1 + }}", "line 1:8: unexpected '}}'"},
      {"{% for x in y %}\n  body", "line 2:7: unexpected end of template, expected 'endfor'"},
      {"{% endif %}", "line 1:4: unknown tag 'endif'"},
      {"x\n  {{ v|nosuch }}", "line 2:8: no filter named 'nosuch'"},
      {"{{ v is nosuch }}", "line 1:9: no test named 'nosuch'"},
      {"{% include 'x' %}", "line 1:4: tag 'include' is not supported"},
      {"{{ 'abc }}", "line 1:4: unterminated string literal"},
      {"{# open", "line 1:1: missing end of comment tag"},
      {"{{ (1 }}", "line 1:7: unexpected '}'"},
      {"{{ x", "line 1:1: unexpected end of template, expected '}}'"},
      {"{% break %}", "line 1:4: 'break' outside of a loop"},
      {"{{ a ! b }}", "line 1:6: unexpected character '!'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.source);
    EXPECT_ERROR(error_of(c.source), c.expect);
  }
  // Unknown filters inside an `if` fail only when reached, as in jinja2.
  EXPECT_EQ(render("{% if false %}{{ x|nosuch }}{% endif %}ok"), "ok");
  EXPECT_ERROR(error_of("{% if true %}{{ x|nosuch }}{% endif %}"), "no filter named");
}

TEST(Jinja, RenderErrorsCarryTheFailingNode) {
  EXPECT_ERROR(error_of("a\n{{ x.y.z }}"), "line 2:");
  EXPECT_ERROR(error_of("{{ x.y.z }}"), "'x' is undefined");
  EXPECT_ERROR(error_of("{{ d.a.b }}", R"({"d": {}})"), "has no attribute 'a'");
  EXPECT_ERROR(error_of("{{ 1 + 'a' }}"), "unsupported operand");
  EXPECT_ERROR(error_of("{{ missing + 1 }}"), "'missing' is undefined");
  EXPECT_ERROR(error_of("{{ 1 // 0 }}"), "by zero");
  EXPECT_ERROR(error_of("{{ missing|tojson }}"), "not JSON serializable");
  EXPECT_ERROR(error_of("{{ 5 < 'a' }}"), "not supported between");
  EXPECT_ERROR(error_of("{% for x in 5 %}{% endfor %}"), "not iterable");
  EXPECT_ERROR(error_of("{% set x = 1 %}{% set x.a = 2 %}"), "non-namespace");
  // Index digits beyond 64 bits: an InputError like any other bad index (std::out_of_range from
  // the digit parse escaped the template before)
  EXPECT_ERROR(error_of("{{ '{99999999999999999999999}'.format(1) }}"), "Replacement index out of range");
  EXPECT_ERROR(error_of("{{ [[1]] | map(attribute='99999999999999999999999') | list }}"), "out of range");
  EXPECT_EQ(render("{{ [[1, 2]] | map(attribute='1') | list }}|{{ '{1}{0}'.format('a', 'b') }}"), "[2]|ba");
}

TEST(Jinja, SandboxForbidsMutationAndDunders) {
  EXPECT_ERROR(error_of("{% set l = [1] %}{{ l.append(2) }}"), "unsafe");
  EXPECT_ERROR(error_of("{{ d.update({'a': 1}) }}", R"({"d": {}})"), "unsafe");
  EXPECT_EQ(render("{{ ''.__class__ }}|{{ d.__len__ is defined }}", R"({"d": {}})"), "|False");
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
  try {
    render("{{ raise_exception('Roles must alternate ' ~ 1) }}");
    ADD_FAILURE();
  } catch (const RaisedError& e) {
    EXPECT_STREQ(e.what(), "Roles must alternate 1");
  }
}

TEST(Jinja, LimitsStopHostileTemplates) {
  Limits small;
  small.max_loop_iterations = 100;
  EXPECT_ERROR(error_of("{% for i in range(10) %}{% for j in range(11) %}{% endfor %}{% endfor %}",
                        "{}", small),
               "iterations");
  small = {};
  small.max_output_bytes = 1000;
  EXPECT_ERROR(error_of("{% for i in range(100) %}0123456789x{% endfor %}", "{}", small),
               "output exceeds");
  EXPECT_ERROR(error_of("{{ 'x' * 2000 }}", "{}", small), "limit");
  EXPECT_ERROR(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
               "macro calls nested more than");
  EXPECT_ERROR(error_of("{{ range(100001)|length }}"), "range too big");
  // Results that would blow up are refused while being built, not after.
  EXPECT_ERROR(error_of("{{ ('a' * 100000).replace('a', 'b' * 1000) }}"), "exceeds");
  EXPECT_ERROR(error_of("{{ 'x'|indent(100000000) }}"), "indent width");
  EXPECT_ERROR(error_of("{% for c in 'x' * 10000000 %}{% endfor %}"), "bytes of strings");
  std::string deep_macro = "{% macro g(n) %}";
  for (int i = 0; i < 60; ++i) deep_macro += "{% if true %}";
  deep_macro += "{{ g(n + 1) }}";
  for (int i = 0; i < 60; ++i) deep_macro += "{% endif %}";
  EXPECT_ERROR(error_of(deep_macro + "{% endmacro %}{{ g(0) }}"), "evaluation nested more than");
  small = {};
  small.max_total_bytes = 1 << 16;
  EXPECT_ERROR(error_of("{% set ns = namespace(s='') %}{% for i in range(1000) %}"
                        "{% set ns.s = ns.s ~ 'abcdefgh' %}{% endfor %}",
                        "{}", small),
               "bytes of strings");
  small = {};
  small.max_nesting = 20;
  EXPECT_ERROR(
      error_of("{{ " + std::string(30, '(') + "1" + std::string(30, ')') + " }}", "{}", small),
      "nested more than 20");
  std::string deep_ifs;
  for (int i = 0; i < 30; ++i) deep_ifs += "{% if true %}";
  for (int i = 0; i < 30; ++i) deep_ifs += "{% endif %}";
  EXPECT_ERROR(error_of(deep_ifs, "{}", small), "nested more than 20");
  small = {};
  small.max_source_bytes = 10;
  EXPECT_ERROR(error_of("{{ 'more than ten bytes' }}", "{}", small), "over the limit");
  // Values nested deeper than Python's recursion limit are refused, not a stack overflow.
  EXPECT_ERROR(error_of("{% set ns = namespace(v=[]) %}{% for i in range(2000) %}"
                        "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}"),
               "nested more than");
}

TEST(Jinja, JsonVariablesKeepTheirKeyOrder) {
  const auto v = nlohmann::ordered_json::parse(R"({"z": 1, "a": {"y": 2, "b": [1.5, null]}})");
  EXPECT_EQ(to_json(Value::from_json(v), {}), R"({"z": 1, "a": {"y": 2, "b": [1.5, null]}})");
  EXPECT_THROW(Value::from_json(nlohmann::ordered_json("bad \xFF")), InputError);
}

TEST(Jinja, RenderIsThreadSafe) {
  const Template t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m %}{% endfor %}"
      "{{ ns.n }}");
  std::vector<std::string> out(8);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < out.size(); ++i) {
    threads.emplace_back([&, i] {
      std::vector<Value> nums;
      for (std::size_t k = 0; k <= i * 100; ++k) nums.push_back(Value::integer(std::int64_t(k)));
      for (int rep = 0; rep < 20; ++rep)
        out[i] = t.render({{"messages", Value::list(nums)}}, kDate);
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t n = i * 100;
    EXPECT_EQ(out[i], std::to_string(n * (n + 1) / 2));
  }
}

// A macro lives in the scope it closes over, and a namespace may hold itself or a macro: both
// are shared_ptr cycles. Every value a render saw must be released when it ends (found by
// tests/fuzz/fuzz_chat_template: GLM-4.6's and Qwen3-Coder's macros leaked every render).
TEST(Jinja, RenderReleasesEverythingItBuilt) {
  const std::vector<std::pair<const char*, const char*>> cycles = {
      {"macro", "{% macro m() %}{{ probe.x }}{% endmacro %}{{ m() }}"},
      {"macro in loop",
       "{% for i in [1, 2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}"
       "{% endfor %}{{ probe.x }}"},
      {"call block",
       "{% macro w() %}[{{ caller() }}]{% endmacro %}"
       "{% call w() %}{{ probe.x }}{% endcall %}"},
      {"namespace holds itself", "{% set ns = namespace(p=probe) %}{% set ns.me = ns %}"},
      {"namespaces hold each other",
       "{% set a = namespace(p=probe) %}"
       "{% set b = namespace(a=a) %}{% set a.b = b %}"},
      {"namespace holds a macro",
       "{% set ns = namespace() %}{% macro m() %}{{ ns }}"
       "{% endmacro %}{% set ns.m = m %}{% set ns.p = probe %}"},
  };
  for (const auto& [name, source] : cycles) {
    auto probe = std::make_shared<ObjectData>();
    probe->is_namespace = true;
    probe->attrs.set(Value::string("x"), Value::integer(7));
    const std::weak_ptr<ObjectData> watch = probe;
    {
      const Template t = Template::parse(source);
      t.render({{"probe", Value::object(std::move(probe))}}, kDate);
    }
    EXPECT_TRUE(watch.expired()) << name << ": the render kept its variables alive";
  }
  // The same when the render fails half-way.
  auto probe = std::make_shared<ObjectData>();
  const std::weak_ptr<ObjectData> watch = probe;
  EXPECT_THROW(Template::parse("{% macro m() %}{% endmacro %}{{ raise_exception('no') }}")
                   .render({{"probe", Value::object(std::move(probe))}}, kDate),
               RaisedError);
  EXPECT_TRUE(watch.expired());
}

TEST(ChatTemplateApi, PassesTransformersVariables) {
  const ChatTemplate t = ChatTemplate::from_source(
      "{{ bos_token }}|{{ eos_token is defined }}|{{ tools is none }}|{{ documents is none }}|"
      "{{ add_generation_prompt }}|{{ enable_thinking }}|{{ reasoning_effort }}|"
      "{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.reasoning_content is defined }}:"
      "{{ m.tool_calls[0].function.name if m.tool_calls else '-' }}:{{ m.tool_call_id }}:"
      "{{ m.name }};{% endfor %}|{{ strftime_now('%d %b %Y') }}",
      ChatSpecialTokens{"<s>", std::nullopt});
  ChatMessage call{"assistant", "", std::nullopt};
  call.tool_calls = nlohmann::ordered_json::parse(
      R"([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}])");
  ChatMessage result{"tool", "42", std::nullopt};
  result.tool_call_id = "c1";
  result.name = "f";
  ChatOptions opt;
  opt.add_generation_prompt = false;
  opt.enable_thinking = false;
  opt.kwargs = {{"reasoning_effort", "high"}, {"enable_thinking", true}};
  opt.now = kDate;
  EXPECT_EQ(t.render({{"user", "hi", std::string("r")}, call, result}, opt),
            "<s>|False|True|True|False|False|high|user:hi:True:-::;assistant::False:f::;"
            "tool:42:False:-:c1:f;|26 Jul 2024");
  opt.kwargs = {{"tools", 1}};
  EXPECT_THROW(t.render({{"user", "hi", {}}}, opt), InputError);
}

TEST(ChatTemplateApi, ErrorsNameTheChatTemplate) {
  try {
    ChatTemplate::from_source("{% if x %}");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("chat template: line 1:"), std::string::npos) << e.what();
  }
  const ChatTemplate t = ChatTemplate::from_source("{{ raise_exception('no system role') }}");
  try {
    t.render({{"system", "s", {}}}, {});
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "chat template: no system role");
  }
}

}  // namespace
}  // namespace moebatch::jinja
