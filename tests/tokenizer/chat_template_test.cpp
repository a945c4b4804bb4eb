// ChatTemplate: the Jinja subset against renders of Python jinja2 in transformers' environment
// (trim_blocks, lstrip_blocks, loop controls, tojson without ASCII escaping), and the errors for
// what it does not support.
#include <gtest/gtest.h>

#include "services/tokenizer/chat_template.h"

namespace litellama {
namespace {

struct Case {
  const char* name;
  const char* source;
  const char* context;
  const char* want;
};

// Expected outputs were produced by jinja2 3.1 with transformers' environment.
const Case kCases[] = {
    {"ws", "  {% if true %}\n    yes\n  {% endif %}\n{{ 'a' }}  \n  {{- 'b' -}}  \n{# c #}\nend\n",
     R"J({})J", "    yes\nabend"},
    {"plus", "x  {%+ if true +%}\ny{% endif %}", R"J({})J", "x  \ny"},
    {"scope", "{% set x = 1 %}{% for i in [1,2] %}{% set x = i * 10 %}{{ x }},{% endfor %}{{ x }}",
     R"J({})J", "10,20,1"},
    {"ns",
     "{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ "
     "ns.n }}",
     R"J({})J", "6"},
    {"strings",
     "{{ '  ab  '.strip() }}|{{ 'x-y-z'.split('-')[1:] }}|{{ 'abc'[::-1] }}|{{ 'é€😀'[1] }}|{{ "
     "'a\\tb' }}|{{ \"it's\" ~ 1 ~ none ~ true }}",
     R"J({})J", "ab|['y', 'z']|cba|€|a\tb|it's1NoneTrue"},
    {"numbers",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 1 / 4 }} {{ 2 ** 10 }} {{ 1e20 }} {{ 0.1 + 0.2 }} "
     "{{ 1.0 }} {{ 3 * 'ab' }}",
     R"J({})J", "3 -4 2 0.25 1024 1e+20 0.30000000000000004 1.0 ababab"},
    {"tests",
     "{{ x is defined }} {{ y is undefined }} {{ x is string }} {{ 3 is divisibleby 3 }} {{ none "
     "is none }} {{ [1] is iterable }} {{ {'a':1} is mapping }}",
     R"J({"x": "s"})J", "True True True True True True True"},
    {"filters",
     "{{ [3,1,2] | join('-') }} {{ 'hi' | upper }} {{ [1,2,3] | length }} {{ ' x ' | trim }} {{ "
     "[1,[2,'a']] | tojson }} {{ {'b': 1, 'a': 'é'} | tojson(indent=2) }} {{ none | default('d') "
     "}} {{ missing | default('d') }} {{ '' | default('e', true) }}",
     R"J({})J", "3-1-2 HI 3 x [1, [2, \"a\"]] {\n  \"b\": 1,\n  \"a\": \"é\"\n} None d e"},
    {"loop",
     "{% for x in items %}{{ loop.index }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ "
     "loop.length }};{% endfor %}",
     R"J({"items": ["a", "b", "c"]})J", "12TrueFalse3;21FalseFalse3;30FalseTrue3;"},
    {"items",
     "{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}{{ d.get('z', 'none') }} {{ d['a'] }} "
     "{{ d.a }}",
     R"J({"d": {"a": 1, "b": [1, "x"]}})J", "a=1 b=[1, 'x'] none 1 1"},
    {"cond",
     "{{ 'y' if 1 > 2 else 'n' }}{{ 'z' if false }}|{{ 1 < 2 < 3 }}{{ 'a' in 'cat' }}{{ 2 not in "
     "[1] }}{{ not 0 }}{{ 0 or 'x' }}{{ 1 and 2 }}",
     R"J({})J", "n|TrueTrueTrueTruex2"},
    {"repr", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}", R"J({})J",
     "[1, 'a', None, True, 1.5, {'k': \"it's\"}]"},
};

// Instantiated under the "tokenizer" prefix like the other suites of this binary, so that
// `ctest -R tokenizer` selects every test; the single parameter only names the instance.
class ChatTemplateTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ChatTemplateTest, MatchesJinja2) {
  for (const Case& c : kCases) {
    auto tmpl = ChatTemplate::parse(c.source);
    ASSERT_TRUE(tmpl.is_ok()) << c.name << ": " << tmpl.status().to_string();
    auto out = tmpl->render(nlohmann::ordered_json::parse(c.context));
    ASSERT_TRUE(out.is_ok()) << c.name << ": " << out.status().to_string();
    EXPECT_EQ(out.value(), c.want) << c.name;
  }
}

TEST_P(ChatTemplateTest, TemplatesThatLoopOverContentReadTypedParts) {
  for (const char* reads_parts :
       {"{% for m in messages %}{% for c in m['content'] %}{{ c['text'] }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for c in "
        "m.content | selectattr('type', 'equalto', 'text') | list %}{{ c.text }}{% endfor %}{% "
        "endif %}{% endfor %}"}) {
    auto t = ChatTemplate::parse(reads_parts);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_TRUE(t->reads_content_parts()) << reads_parts;
  }
  for (const char* reads_strings : {"{% for m in messages %}{{ m['content'] }}{% endfor %}",
                                    "{% for m in messages %}{% for line in "
                                    "m['content'].split('\\n') %}{{ line }}{% endfor %}{% "
                                    "endfor %}",
                                    "{% for c in contents %}{{ c }}{% endfor %}"}) {
    auto t = ChatTemplate::parse(reads_strings);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_FALSE(t->reads_content_parts()) << reads_strings;
  }
}

TEST_P(ChatTemplateTest, TrailingNewlineAndCrLfAreNormalizedLikeJinja) {
  auto tmpl = ChatTemplate::parse("a\r\nb\rc\n");
  ASSERT_TRUE(tmpl.is_ok());
  EXPECT_EQ(tmpl->render(nlohmann::ordered_json::object()).value(), "a\nb\nc");
}

TEST_P(ChatTemplateTest, RaiseExceptionReturnsItsMessage) {
  auto tmpl = ChatTemplate::parse(
      "{% if messages | length > 1 %}{{ raise_exception('only one message, please') }}{% endif "
      "%}ok");
  ASSERT_TRUE(tmpl.is_ok());
  nlohmann::ordered_json ctx;
  ctx["messages"] = nlohmann::ordered_json::array({1, 2});
  auto out = tmpl->render(ctx);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("only one message, please"), std::string::npos);
  ctx["messages"] = nlohmann::ordered_json::array({1});
  EXPECT_EQ(tmpl->render(ctx).value(), "ok");
}

TEST_P(ChatTemplateTest, UnsupportedConstructsAreReportedWithTheirLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% macro m(x) %}{{ x }}{% endmacro %}", "'{% macro %}' at line 1"},
      {"a\n{% include 'other.jinja' %}", "'{% include %}' at line 2"},
      {"{% extends 'base' %}", "'{% extends %}' at line 1"},
      {"{% call foo() %}{% endcall %}", "'{% call %}' at line 1"},
      {"{% filter upper %}x{% endfilter %}", "'{% filter %}' at line 1"},
      {"{% raw %}{{ x }}{% endraw %}", "'{% raw %}' at line 1"},
      {"{% for x in xs recursive %}{% endfor %}", "recursive for loop at line 1"},
  };
  for (const auto& [source, expected] : cases) {
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_FALSE(tmpl.is_ok()) << source;
    EXPECT_EQ(tmpl.status().code(), StatusCode::kUnsupported) << source;
    EXPECT_NE(tmpl.status().message().find(expected), std::string::npos)
        << source << " -> " << tmpl.status().message();
    EXPECT_NE(tmpl.status().message().find("outside the supported Jinja subset"),
              std::string::npos);
  }
}

TEST_P(ChatTemplateTest, UnsupportedFiltersAndTestsFailAtRender) {
  for (const char* source :
       {"{{ 'x' | wordwrap(3) }}", "{{ 'x' is sameas_what }}", "{{ '%s' % 'x' }}"}) {
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_TRUE(tmpl.is_ok()) << source << ": " << tmpl.status().to_string();
    auto out = tmpl->render(nlohmann::ordered_json::object());
    ASSERT_FALSE(out.is_ok()) << source;
    EXPECT_EQ(out.status().code(), StatusCode::kUnsupported) << source;
  }
}

TEST_P(ChatTemplateTest, SyntaxErrorsAreInvalidArgument) {
  for (const char* source :
       {"{% if x %}never closed", "{{ 'unterminated }}", "{{ (1 + }}", "{% endfor %}",
        "{% for x in %}{% endfor %}", "{{ x..y }}", "{#  unclosed comment", "{% break %}"}) {
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_FALSE(tmpl.is_ok()) << source;
    EXPECT_EQ(tmpl.status().code(), StatusCode::kInvalidArgument) << source;
    EXPECT_NE(tmpl.status().message().find("line"), std::string::npos) << tmpl.status().message();
  }
}

TEST_P(ChatTemplateTest, RuntimeErrorsDoNotCrash) {
  for (const char* source : {"{{ undefined_thing.attr }}", "{{ 1 / 0 }}", "{{ 'a' + 1 }}",
                             "{% for x in none %}{% endfor %}", "{{ 1 < 'a' }}", "{{ (1)() }}"}) {
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_TRUE(tmpl.is_ok()) << source << ": " << tmpl.status().to_string();
    auto out = tmpl->render(nlohmann::ordered_json::object());
    EXPECT_FALSE(out.is_ok()) << source << " rendered " << out.value();
  }
}

// Templates that once crashed the interpreter or ran without bound (tests/fuzz/reproducers/
// chat_template_fuzzer/ has the fuzz inputs): each is a clear error now.
TEST_P(ChatTemplateTest, HostileTemplatesAreErrorsNotCrashes) {
  const std::string deep_parens =
      "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  std::string not_chain = "{{ ";
  for (int i = 0; i < 5000; ++i) not_chain += "not ";
  not_chain += "x }}";
  std::string deep_if;
  for (int i = 0; i < 3000; ++i) deep_if += "{% if true %}";
  for (int i = 0; i < 3000; ++i) deep_if += "{% endif %}";
  std::string long_sum = "{{ 1";
  for (int i = 0; i < 4000; ++i) long_sum += " + 1";
  long_sum += " }}";
  for (const std::string& source :
       {std::string("{{ 99999999999999999999 }}"), deep_parens, not_chain, deep_if, long_sum}) {
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_FALSE(tmpl.is_ok()) << source.substr(0, 40);
    EXPECT_EQ(tmpl.status().code(), StatusCode::kInvalidArgument) << tmpl.status().to_string();
  }
  for (const char* source :
       {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}", "{{ 2 ** 64 }}",
        "{{ 3037000500 * 3037000500 }}", "{{ 2 ** 99999999999 }}", "{{ 'ab' * 99999999999 }}",
        "{{ [1, 2] * 9999999999 }}", "{{ 1e300 | int }}", "{{ (0.0 / 1.0 - 1e308 * 10) | int }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"}) {
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_TRUE(tmpl.is_ok()) << source << ": " << tmpl.status().to_string();
    auto out = tmpl->render(nlohmann::ordered_json::object());
    ASSERT_FALSE(out.is_ok()) << source << " rendered " << out.value().substr(0, 40);
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << out.status().to_string();
  }
  // In range, the same operations still work.
  auto ok = ChatTemplate::parse(
      "{{ 9223372036854775806 + 1 }} {{ 2 ** 62 }} {{ 'ab' * 3 }} {{ 1e10 | int }} "
      "{{ range(9223372036854775800, 9223372036854775807, 4) | list }}");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  auto out = ok->render(nlohmann::ordered_json::object());
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out,
            "9223372036854775807 4611686018427387904 ababab 10000000000 "
            "[9223372036854775800, 9223372036854775804]");
}

INSTANTIATE_TEST_SUITE_P(tokenizer, ChatTemplateTest, ::testing::Values("jinja"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace litellama
