"""Fuzzes the Megatron .idx reader (data/indexed_dataset.cc, ParseIndex) with libFuzzer for ~20 s.

The target (tests/fuzz/idx_fuzzer.cc) is built with clang from tests/fuzz/CMakeLists.txt into
<build>/fuzz with AddressSanitizer and UBSan; any crash, sanitizer report or exception other than
crucible::Error fails the test and leaves the input in the test's folder. The seed corpus is the
small valid .idx files in tests/fuzz/corpus/idx (uint16, int32 with multi-sequence documents,
uint8, empty)."""
import os
import shutil
import subprocess

from conftest import REPO, build_fuzzer

SECONDS = int(os.environ.get("CRUCIBLE_FUZZ_SECONDS", "20"))


def test_idx_reader_survives_libfuzzer(tmp_path):
    fuzzer = build_fuzzer("idx_fuzzer")
    corpus = tmp_path / "corpus"
    shutil.copytree(REPO / "tests" / "fuzz" / "corpus" / "idx", corpus)
    proc = subprocess.run([fuzzer, f"-max_total_time={SECONDS}", "-timeout=10", "-rss_limit_mb=2048",
                           "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", corpus],
                          capture_output=True, text=True, timeout=SECONDS + 120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = [line for line in proc.stderr.splitlines() if line.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) > 1000, proc.stderr[-2000:]
