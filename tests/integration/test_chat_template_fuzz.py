"""Fuzzes crucible's Jinja interpreter of chat templates (src/sft/jinja*.cc) with libFuzzer for
~20 s: any byte string as a template must render or end in a jinja::Error, never crash or hang.

The target (tests/fuzz/jinja_fuzzer.cc) is built with clang from tests/fuzz/CMakeLists.txt into
<build>/fuzz with AddressSanitizer and UBSan; a crash, sanitizer report, timeout or exception other
than jinja::Error fails the test and leaves the input in the test's folder. The seed corpus is the
reference templates (tests/golden/chat_templates/) and the Jinja snippets of test_chat_template.py,
with a dictionary of Jinja's tokens (tests/fuzz/jinja.dict)."""
import os
import shutil
import subprocess

from conftest import REPO, build_fuzzer
from test_chat_template import SNIPPETS, UNSUPPORTED

SECONDS = int(os.environ.get("CRUCIBLE_FUZZ_SECONDS", "20"))


def test_jinja_interpreter_survives_libfuzzer(tmp_path):
    fuzzer = build_fuzzer("jinja_fuzzer")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for template in (REPO / "tests" / "golden" / "chat_templates").glob("*.jinja"):
        shutil.copy(template, corpus)
    for i, template in enumerate([t for t, _ in SNIPPETS] + UNSUPPORTED):
        (corpus / f"snippet{i}").write_bytes(template.encode())
    proc = subprocess.run([fuzzer, f"-max_total_time={SECONDS}", "-timeout=10", "-rss_limit_mb=2048",
                           f"-dict={REPO / 'tests' / 'fuzz' / 'jinja.dict'}", "-print_final_stats=1",
                           f"-artifact_prefix={tmp_path}/", corpus],
                          capture_output=True, text=True, timeout=SECONDS + 120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = [line for line in proc.stderr.splitlines() if line.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) > 1000, proc.stderr[-2000:]
