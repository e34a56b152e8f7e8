"""`make demo` on a fresh machine: it installs only what the demo needs, keeps apt's and dpkg's
output in a log file, and shows one line per phase. The installer runs here against a stand-in
`apt-get` and `dpkg-query` (nothing installed, every install recorded), so the test sees exactly
what a fresh machine would be asked to install."""
import os
import subprocess
from pathlib import Path

from conftest import REPO

# What the test suite needs and the demo does not (each pulls in tens of packages: Slurm, MPICH,
# Debian's torch, GoogleTest, clang).
NOT_FOR_THE_DEMO = {"slurm-wlm", "munge", "mpich", "libmpich-dev", "python3-torch", "libgtest-dev",
                    "libgmock-dev", "libbenchmark-dev", "clang", "libclang-rt-14-dev", "python3-venv",
                    "chromium", "chromium-driver", "tmux"}


def stand_ins(tmp_path):
    """A PATH where dpkg-query says nothing is installed and apt-get records its arguments and
    prints as much as the real one does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "apt-get.args"
    (bin_dir / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "apt-get").write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" >> {record}\n"
        "i=0; while [ $i -lt 200 ]; do echo \"Unpacking package-$i ...\"; i=$((i+1)); done\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CRUCIBLE_CACHE=str(tmp_path / "cache"))
    return env, record


def installed_by(record):
    lines = [line.split() for line in record.read_text().splitlines() if " install " in f" {line} "]
    return {word for line in lines for word in line if not word.startswith("-") and word != "install"}


def test_the_demo_installs_only_what_it_needs_in_one_line_with_a_log(tmp_path):
    env, record = stand_ins(tmp_path)
    proc = subprocess.run([REPO / "scripts" / "install-deps.sh", "--demo"], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    packages = installed_by(record)
    assert {"cmake", "libdnnl-dev", "libopenmpi-dev"} <= packages, packages
    assert not packages & NOT_FOR_THE_DEMO, packages & NOT_FOR_THE_DEMO
    output = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(output) == 1, output[:5]
    assert output[0].startswith(f"install-deps: installing {len(packages)} packages (")
    assert "done in" in output[0] and f"(log: {tmp_path}/cache/install-deps.log)" in output[0], output
    assert "Unpacking package-199" in (tmp_path / "cache" / "install-deps.log").read_text()


def test_the_test_suite_installs_everything(tmp_path):
    env, record = stand_ins(tmp_path)
    proc = subprocess.run([REPO / "scripts" / "install-deps.sh"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert NOT_FOR_THE_DEMO <= installed_by(record)


def test_a_failed_install_says_so_with_the_end_of_its_log(tmp_path):
    env, record = stand_ins(tmp_path)
    (Path(env["PATH"].split(":")[0]) / "apt-get").write_text(
        "#!/bin/sh\necho 'E: Unable to locate package nosuch'; exit 100\n")
    proc = subprocess.run([REPO / "scripts" / "install-deps.sh", "nosuch"], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 1
    assert "FAILED" in proc.stderr and "Unable to locate package nosuch" in proc.stderr, proc.stderr


def test_make_demo_neither_installs_the_test_set_nor_builds_the_venv():
    plan = subprocess.run(["make", "-n", "demo"], capture_output=True, text=True, cwd=REPO,
                          timeout=60).stdout
    assert "scripts/install-deps.sh --demo" in plan, plan
    assert "setup-venv" not in plan and "setup-current" not in plan, plan
    for line in plan.splitlines():
        if "install-deps.sh" in line:
            assert "--demo" in line or "bible-kjv" in line, line
