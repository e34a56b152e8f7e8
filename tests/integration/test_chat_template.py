"""Chat templates equal to Hugging Face's (docs/post-training.md, "Chat templates"): crucible's
named templates render a set of conversations (system turns, multi-turn, empty content, unicode,
with and without the generation prompt) byte for byte as transformers' apply_chat_template renders
them with the reference Jinja of each model (tests/golden/chat_templates/), their assistant spans
cover each assistant message and its end-of-turn marker, crucible's Jinja interpreter renders the
reference templates and a set of Jinja snippets as transformers' jinja2 environment does, and
`crucible chat-template detect` names each reference template and refuses a changed one, or one
using a construct the interpreter lacks, in one line.

transformers runs in the "current" test environment (conftest.py: transformers 5, jinja2 3.1.6),
in one subprocess per test. The pinned set is not used: transformers 4.40.2's private folder
(scripts/setup-hf-interop.sh) has no jinja2, which apply_chat_template needs."""
import json
import subprocess

import pytest

from conftest import REPO, crucible_binary, python_env, run_crucible

TEMPLATES = REPO / "tests" / "golden" / "chat_templates"
NAMES = ["llama3", "chatml", "deepseek-v3"]
BOS = {"llama3": "<|begin_of_text|>", "chatml": "<s>", "deepseek-v3": "<｜begin▁of▁sentence｜>"}
EOS = {"llama3": "<|end_of_text|>", "chatml": "<|im_end|>", "deepseek-v3": "<｜end▁of▁sentence｜>"}
END_OF_TURN = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>", "deepseek-v3": "<｜end▁of▁sentence｜>"}


def chat(*turns, agp=False):
    return {"messages": [{"role": r, "content": c} for r, c in turns], "add_generation_prompt": agp}


CONVERSATIONS = [
    chat(("user", "Hello"), agp=True),
    chat(("user", "Hello")),
    chat(("system", "You are a helpful assistant."), ("user", "Hi"), ("assistant", "Hello! How can I help?")),
    chat(("user", "What is 2+2?"), ("assistant", "4"), ("user", "And 3+3?"), ("assistant", "6"),
         ("user", "Thanks"), ("assistant", "You're welcome.")),
    chat(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hey"), ("user", "Bye"), agp=True),
    chat(("system", ""), ("user", ""), ("assistant", "")),
    chat(("user", ""), ("assistant", ""), agp=True),
    chat(("user", "Grüße 👋 — 東京 עברית e\u0301"), ("assistant", "\u3000こんにちは\u00a0"), ("user", "\u2028")),
    chat(("user", "  padded \n"), ("assistant", "\n\tpadded answer  \r\n"), agp=True),
    chat(("system", "first"), ("user", "q"), ("system", "second"), ("assistant", "a")),
    chat(("assistant", "I start."), ("user", "ok")),
    chat(("user", "{{ not a tag }} {% if x %} <|eot_id|> <｜User｜> <|im_start|>"), ("assistant", "{# c #}")),
    chat(("user", "line one\nline two\n\nline four"), ("assistant", "x" * 2000), agp=True),
    chat(("user", "last turn is the assistant's"), ("assistant", "so no prompt follows"), agp=True),
]

# Jinja the interpreter must render exactly as transformers' environment does (or fail where it fails).
SNIPPETS = [
    ("a\n  {% if true %}\n  x\n  {% endif %}\nb\n", {}),
    ("a  \n {%- if true -%} \n x \n {%- endif -%}\n b", {}),
    ("  {%+ if true %}x{% endif %}|\n  {% if true +%}\ny{% endif %}", {}),
    ("  {# c #}\nA{#- c -#}  B {#+ c #}\nC {% raw %}{{ not }}{% endraw %}\n{%- raw -%}  {% x %}  {%- endraw %} D", {}),
    ("\n\n{{- 'x' -}}\n\n  {{ 'y' }}  \n", {}),
    ("x\r\ny\rz\n", {}),
    ("{{ 1/2 }} {{ 3/1 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2**-1 }} {{ 1e20 }} "
     "{{ 1.5e-5 }} {{ 0.1+0.2 }} {{ 1e16 }} {{ -0.0 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1_000 }} {{ 0x1f }}", {}),
    ("{{ [1,'a',none,true,{'k':'v'}] }} {{ \"it's\" }} {{ (1,2) }} {{ (1,) }} {{ none }} {{ undefined_var }}|"
     "{{ 'a\\'b\"c' }}|{{ ['x\\ny', '\\t', '\u00e9\\x85'] }}", {}),
    ("{{ 'abc'[1:] }}{{ 'héllo'|length }}{{ 'héllo'[1] }}{{ 'héllo'[-1] }}{{ 'héllo'[::-1] }}"
     "{{ [1,2,3,4,5][1:4:2] }}{{ [1,2,3][::-1] }}{{ 'abc'[5:] }}|{{ [1,2,3][-5:2] }}{{ 'hello'[10] }}", {}),
    ("{{ {'b':1,'a':[1,2.5,'é\\n\"\\\\']}|tojson }}|{{ x|tojson }}|{{ x|tojson(indent=2) }}|"
     "{{ x|tojson(sort_keys=true) }}|{{ [] | tojson(indent=2) }}|{{ 'é'|tojson(ensure_ascii=true) }}|"
     "{{ '😀'|tojson(ensure_ascii=true) }}|{{ {'a': none, 'b': true, 'c': 1.0} | tojson(separators=(',', ':')) }}",
     {"x": {"z": [1, {"y": None}], "a": "\u0001"}}),
    ("{{ 'x' is string }}{{ 1 is number }}{{ true is number }}{{ none is none }}{{ u is defined }}"
     "{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ {} is mapping }}"
     "{{ 'a' is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'ab' is lower }}"
     "{{ 1 is in [1,2] }}{{ 'a' is eq 'a' }}{{ 2 is gt 1 }}{{ x is not defined }}{{ none is sameas none }}", {}),
    ("{{ 'a\\tb\\u00e9\\x41\\d\\101\\U0001F600' }}|{{ \"line\\\nnext\" }}|{{ 'a' 'b' \"c\" }}", {}),
    ("{% for a in [1,2,3] if a > 1 %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('x','y') }};"
     "{% else %}empty{% endfor %}{% for a in [] %}x{% else %}none{% endfor %}", {}),
    ("{% for i in [1,2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}|{% set x = 0 %}"
     "{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{x}}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("{% set ns = namespace(count=0, items='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}"
     "{% set ns.items = ns.items ~ m.role ~ ',' %}{% endfor %}{{ ns.count }} {{ ns.items }}",
     {"messages": [{"role": "user"}, {"role": "assistant"}]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{{ d.keys()|list }}"
     "{{ d.values()|list }}{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}{{ d['a'] }}{{ d.a }}"
     "{{ d.zz is defined }}", {"d": {"b": 2, "a": 1}}),
    ("{{ '  x y  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|"
     "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|"
     "{{ ' a  b '.split(none, 1) }}|{{ ' a  b '.rsplit(none, 1) }}|{{ 'abc'.startswith('ab') }}"
     "{{ 'abc'.endswith(('x','c')) }}|{{ 'Hello World'.upper() }}{{ 'Hello'.lower() }}{{ 'hello world-x'.title() }}"
     "{{ 'hELLO'.capitalize() }}|{{ 'aaa'.replace('a','b',2) }}|{{ 'abcabc'.find('c') }}{{ 'abcabc'.rfind('c') }}"
     "{{ 'héé'.find('é') }}{{ 'abab'.count('ab') }}|{{ '-'.join(['a','b']) }}|{{ 'l1\\nl2\\r\\nl3'.splitlines() }}|"
     "{{ '12'.isdigit() }}{{ ' \\t'.isspace() }}", {}),
    ("{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ [1,2,3]|length }}{{ 'héllo'|count }}{{ u|length }}|"
     "{{ u|default('d') }}{{ ''|default('d') }}{{ ''|default('d', true) }}{{ none|d('n') }}|{{ [3,1,2]|first }}"
     "{{ [3,1,2]|last }}{{ 'abc'|first }}|{{ ['a','b']|join(', ') }}{{ [1,2]|join }}|{{ 'hello'|upper }}"
     "{{ 'HeLLo'|lower }}{{ 'hello wORLD-x(y'|title }}{{ 'hello'|capitalize }}|{{ 'aab'|replace('a','x') }}|"
     "{{ [1,2,3]|reverse|list }}{{ 'abc'|reverse }}|{{ 5|string }}{{ 1.5|int }}{{ '42'|int }}{{ 'x'|int }}"
     "{{ '3.5'|float }}{{ -3|abs }}{{ 2.5|round }}{{ 3.5|round }}{{ 2.4|round(method='ceil') }}", {}),
    ("{{ msgs|map(attribute='role')|list }}|{{ msgs|selectattr('role','equalto','user')|list|length }}|"
     "{{ msgs|rejectattr('role','equalto','user')|map(attribute='content')|join(',') }}|"
     "{{ [1,2,3,4]|select('odd')|list }}|{{ [1,0,2]|select|list }}|{{ [1,2]|reject('even')|list }}|"
     "{{ ['b','A','c']|sort }}|{{ ['b','A','c']|sort(case_sensitive=true) }}|"
     "{{ msgs|sort(attribute='role',reverse=true)|map(attribute='content')|list }}|{{ [1,2,2,1]|unique|list }}|"
     "{{ [3,1,2]|min }}{{ [3,1,2]|max }}{{ [1,2,3]|sum }}|{{ ['1','2']|map('int')|list }}|"
     "{{ msgs|selectattr('tool_calls','defined')|list|length }}|{{ msgs|map(attribute='missing', default='z')|list }}",
     {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": []},
               {"role": "user", "content": "c"}]}),
    ("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} "
     "{{ greet('B', '?') }} {{ greet(name='C', punct='.') }} [{{ greet() }}]", {}),
    ("{%- set system %}  S: {{ who }}  {% endset -%}[{{ system }}]{% set t | trim %}  padded  {% endset %}[{{ t }}]"
     "{% filter upper %}up {{ who }}{% endfilter %}{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}",
     {"who": "me"}),
    ("{{ 'a' if x else 'b' }}{{ 'c' if not x }}|{{ x or 'default' }}{{ x and 'yes' }}{{ 1 and 2 }}{{ 0 or none }}|"
     "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' in 'cat' }}{{ 'x' not in ['y'] }}{{ not 'k' in {'k': 1} }}|{{ [1] + [2] }}"
     "{{ 'a' ~ 1 ~ none }}{{ 'ab' * 2 }}{{ -(1 + 2) * 3 }}{{ 2 ** 3 ** 2 }}{{ 'a' ~ 'b' | upper }}{{ -2 ** 2 }}",
     {"x": False}),
    ("{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}{{ range(3)|list }}"
     "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}"
     "{% endfor %}", {}),
    ("{{ dict(a=1, b='x') }}{% set d = {'k': [1, {'n': none}]} %}{{ d.k[1].n }}{{ d['k'][0] }}{{ d.k.0 }}"
     "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% for (p, q) in [[1,2],[3,4]] %}{{ p * q }}{% endfor %}", {}),
    ("{%- for m in messages %}\n    {%- if m.role == 'user' %}\n        {{- '<u>' + m.content + '</u>\\n' }}\n"
     "    {%- elif m.role == 'assistant' %}\n        {{- '<a>' + m.content }}\n        {%- if m.tool_calls %}\n"
     "            {%- for tc in m.tool_calls %}\n                {{- '\\n' + tc.function.name + ':' + "
     "tc.function.arguments | tojson }}\n            {%- endfor %}\n        {%- endif %}\n        {{- '</a>\\n' }}\n"
     "    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<a>' }}\n{%- endif %}\n",
     {"messages": [{"role": "user", "content": "q"},
                   {"role": "assistant", "content": "r", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}],
      "add_generation_prompt": True}),
    ("{{ '<think>a</think>b'.split('</think>')[-1] }}|{% set c = 'a</think>\\n\\nb' %}"
     "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ 'x'|indent(2) }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|"
     "{{ 'a\\nb'|indent(2, true) }}|{{ '<a href=\"x\">&</a>'|e }}", {}),
    ("{{ messages }}|{{ 'x' | tojson }}{{ 1.0 | tojson }}{{ none | tojson }}{{ 'a\\u2028b\\x7f'|tojson }}",
     {"messages": [{"role": "user", "content": "a'b", "n": 1.5, "z": None}]}),
    ("{{ raise_exception('boom') }}", {}),
    ("{{ x.y }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 5 // 0 }}", {}),
    ("{% for x in 5 %}{% endfor %}", {}),
    ("{{ 1 in 'abc' }}", {}),
]

# Valid Jinja the interpreter declines: it must say "unsupported", never render something else.
UNSUPPORTED = ["{{ [1,2]|batch(1)|list }}", "{{ strftime_now('%Y') }}", "{{ 'é'|upper }}",
               "{{ 10000000000 * 10000000000 }}", "{% call foo() %}{% endcall %}", "{{ '%s' % 1 }}"]


@pytest.fixture(scope="module")
def hf():
    return python_env("current")


HF_RENDER = r"""
import json, sys
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
names, bos, eos, conversations = json.loads(sys.stdin.read())
out = {}
for name in names:
    template = open(sys.argv[1] + "/" + name + ".jinja", encoding="utf-8").read()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                        bos_token=bos[name], eos_token=eos[name])
    out[name] = [tokenizer.apply_chat_template(c["messages"], chat_template=template, tokenize=False,
                                               add_generation_prompt=c["add_generation_prompt"])
                 for c in conversations]
print(json.dumps(out))
"""


def hf_run(hf, code, payload, *args):
    """Runs `code` in the transformers environment with `payload` as JSON on stdin."""
    import os
    proc = subprocess.run([hf.python, "-c", code, *map(str, args)], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout)


def crucible_render(*args, lines):
    proc = subprocess.run([crucible_binary(), "chat-template", "render", *args],
                          input="".join(json.dumps(l) + "\n" for l in lines), capture_output=True, text=True,
                          timeout=60)
    # One JSON object per "\n"-ended line (not str.splitlines: the text may hold U+2028).
    return proc, [json.loads(l) for l in proc.stdout.split("\n") if l]


def test_named_templates_render_as_transformers_apply_chat_template(hf):
    expected = hf_run(hf, HF_RENDER, [NAMES, BOS, EOS, CONVERSATIONS], TEMPLATES)
    for name in NAMES:
        proc, named = crucible_render("--template", name, "--bos-token", BOS[name], "--eos-token", EOS[name],
                                      lines=CONVERSATIONS)
        assert proc.returncode == 0, proc.stderr
        proc, interpreted = crucible_render("--jinja", TEMPLATES / f"{name}.jinja", "--bos-token", BOS[name],
                                            "--eos-token", EOS[name], lines=CONVERSATIONS)
        assert proc.returncode == 0, proc.stderr
        for i, conversation in enumerate(CONVERSATIONS):
            hf_text = expected[name][i]
            assert named[i]["text"].encode() == hf_text.encode(), (name, i, named[i]["text"], hf_text)
            assert interpreted[i]["text"].encode() == hf_text.encode(), (name, i, interpreted[i], hf_text)
            # The spans are each assistant message as written (llama3 strips it) and its end of turn.
            raw = named[i]["text"].encode()
            spans = [raw[b:e].decode() for b, e in named[i]["assistant_spans"]]
            contents = [m["content"] for m in conversation["messages"] if m["role"] == "assistant"]
            if name == "llama3":
                contents = [c.strip() for c in contents]
            assert spans == [c + END_OF_TURN[name] for c in contents], (name, i, spans)


def test_the_interpreter_renders_jinja_as_transformers_environment_does(hf, tmp_path):
    code = r"""
import json, sys
from transformers.utils.chat_template_utils import _compile_jinja_template
out = []
for template, variables in json.loads(sys.stdin.read()):
    try:
        out.append({"text": _compile_jinja_template(template).render(**variables)})
    except Exception as e:
        out.append({"error": type(e).__name__ + ": " + str(e)})
print(json.dumps(out))
"""
    expected = hf_run(hf, code, SNIPPETS + [(t, {}) for t in UNSUPPORTED])
    for i, (template, variables) in enumerate(SNIPPETS + [(t, {}) for t in UNSUPPORTED]):
        path = tmp_path / f"snippet{i}.jinja"
        path.write_bytes(template.encode())
        proc, out = crucible_render("--jinja", path, lines=[variables])
        got = out[0] if out else {"error": proc.stderr.strip(), "kind": "parse"}
        if i >= len(SNIPPETS):
            assert got.get("kind") == "unsupported" or "unsupported" in got.get("error", ""), (template, got)
        elif "error" in expected[i]:
            assert "error" in got, (template, expected[i], got)
        else:
            assert got.get("text") == expected[i]["text"], (template, expected[i], got)


def write_config(folder, name, template, bos, eos):
    folder.mkdir(parents=True, exist_ok=True)
    config = {"bos_token": bos, "eos_token": eos, "chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return folder / "tokenizer_config.json"


def refused(*args):
    proc = run_crucible("chat-template", *args, check=False, timeout=60)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    return lines[0]


def test_detect_names_each_reference_template_and_refuses_others_in_one_line(tmp_path):
    for name in NAMES:
        template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
        bos = {"__type": "AddedToken", "content": BOS[name]} if name == "deepseek-v3" else BOS[name]
        path = write_config(tmp_path / name, name, template, bos, EOS[name])
        proc = run_crucible("chat-template", "detect", path)
        assert proc.stdout.startswith(f"chat_template={name} probes="), proc.stdout

    llama3 = (TEMPLATES / "llama3.jinja").read_text(encoding="utf-8")
    changed = llama3.replace("'<|eot_id|>'", "'<|eot_id|>\n'")
    line = refused("detect", write_config(tmp_path / "changed", "x", changed, BOS["llama3"], EOS["llama3"]))
    assert "chat_template is not one of llama3, chatml, deepseek-v3 (the closest, llama3, differs on probe 1 of" \
        in line and "pass --chat-template NAME" in line, line

    unsupported = "{{ 'Today ' ~ strftime_now('%d %b %Y') }}" + llama3
    line = refused("detect", write_config(tmp_path / "unsupported", "x", unsupported, BOS["llama3"], EOS["llama3"]))
    assert "does not support (function 'strftime_now()'" in line and "pass --chat-template NAME" in line, line

    line = refused("detect", write_config(tmp_path / "broken", "x", "{% for m in messages %}", "<s>", "</s>"))
    assert "is not valid Jinja" in line, line

    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    line = refused("detect", tmp_path / "none" / "tokenizer_config.json")
    assert "no chat_template; pass --chat-template NAME" in line, line


def test_bad_input_to_render_is_one_line_errors():
    proc, _ = crucible_render("--template", "chatml", lines=[chat(("user", "a"), ("tool", "b"))])
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 65 and len(lines) == 1, proc.stderr
    assert "<stdin>:1: message 1: unknown role 'tool' (expected system, user or assistant)" in lines[0], lines
    proc, _ = crucible_render("--template", "llama2", lines=[chat(("user", "a"))])
    assert proc.returncode == 2 and "unknown chat template 'llama2' (expected one of llama3, chatml, deepseek-v3)" \
        in proc.stderr, proc.stderr
