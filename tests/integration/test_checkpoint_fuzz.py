"""Fuzzes the safetensors reader (checkpoints, HF import) with libFuzzer for ~20 s.

The target (tests/fuzz/safetensors_fuzzer.cc) is built with clang from tests/fuzz/CMakeLists.txt
into <build>/fuzz, next to the crucible binary, with AddressSanitizer and UBSan; any crash, leak,
sanitizer report or exception other than crucible::Error fails the test and leaves the input in
the test's folder. The seed corpus is a few valid files written by the safetensors package."""
import os
import shutil
import subprocess

import numpy as np
from safetensors.numpy import save_file

from conftest import REPO, build_fuzzer

SECONDS = int(os.environ.get("CRUCIBLE_FUZZ_SECONDS", "20"))


def test_safetensors_reader_survives_libfuzzer(tmp_path):
    fuzzer = build_fuzzer("safetensors_fuzzer")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    save_file({"a": np.ones((2, 3), np.float32), "b": np.arange(4, dtype=np.int32),
               "c": np.ones(3, np.float16)}, str(corpus / "mixed"), metadata={"format": "pt"})
    save_file({"x": np.zeros((0,), np.float32)}, str(corpus / "empty_tensor"))
    save_file({"w": np.linspace(-1, 1, 16, dtype=np.float64).reshape(4, 4)}, str(corpus / "f64"))
    proc = subprocess.run([fuzzer, f"-max_total_time={SECONDS}", "-timeout=10", "-rss_limit_mb=2048",
                           "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", corpus],
                          capture_output=True, text=True, timeout=SECONDS + 120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = [line for line in proc.stderr.splitlines() if line.startswith("stat::number_of_executed_units")]
    assert runs and int(runs[0].split(":")[-1]) > 1000, proc.stderr[-2000:]
