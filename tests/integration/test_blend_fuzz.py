"""Fuzzes the blendcorpus file list parser and the blend index builder with libFuzzer, ~20 s each.

The targets (tests/fuzz/file_list_fuzzer.cc: text -> ParseFileList -> BlendShares ->
BuildBlendIndex; tests/fuzz/blend_index_fuzzer.cc: encoded weights -> BlendShares ->
BuildBlendIndex) are built with clang from tests/fuzz/CMakeLists.txt into <build>/fuzz with
AddressSanitizer and UBSan. Any crash, hang, sanitizer report, exception other than
crucible::Error, or blend index that breaks the quota method's promise (tests/fuzz/blend_check.h:
every dataset within one sample of its share at every prefix, running sample numbers, prefix
stability) fails the test and leaves the input in the test's folder. Seed corpora:
tests/fuzz/corpus/file_list and tests/fuzz/corpus/blend_index."""
import os
import shutil
import subprocess

import pytest

from conftest import REPO, build_fuzzer

SECONDS = int(os.environ.get("CRUCIBLE_FUZZ_SECONDS", "20"))
FUZZ = REPO / "tests" / "fuzz"


@pytest.mark.parametrize("target,corpus,extra", [
    ("file_list_fuzzer", "file_list", [f"-dict={FUZZ / 'file_list.dict'}"]),
    ("blend_index_fuzzer", "blend_index", []),
])
def test_blend_parsing_and_indexing_survive_libfuzzer(tmp_path, target, corpus, extra):
    fuzzer = build_fuzzer(target)
    work = tmp_path / "corpus"
    shutil.copytree(FUZZ / "corpus" / corpus, work)
    proc = subprocess.run([fuzzer, f"-max_total_time={SECONDS}", "-timeout=10", "-rss_limit_mb=2048",
                           "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", *extra, work],
                          capture_output=True, text=True, timeout=SECONDS + 300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = [line for line in proc.stderr.splitlines() if line.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) > 1000, proc.stderr[-2000:]
