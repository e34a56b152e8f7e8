"""The command words of `crucible`: an unknown command, at the top or under a command that has
subcommands, is a usage error (exit 2, one line) naming it and the closest valid one, with or
without --help; known commands and their options are untouched."""
import pytest

from conftest import run_crucible


def refused(*args):
    proc = run_crucible(*args, check=False, timeout=60)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Usage" not in proc.stdout, proc.stdout
    return lines[0]


@pytest.mark.parametrize("help", [[], ["--help"]], ids=["plain", "help"])
def test_an_unknown_command_is_exit_2_naming_it_and_the_closest_valid_one(help):
    line = refused("trian", *help)
    assert "unknown command 'trian'" in line and "did you mean 'train'?" in line, line
    line = refused("nosuchcmd", *help)
    assert "unknown command 'nosuchcmd'" in line and "did you mean '" in line, line


@pytest.mark.parametrize("help", [[], ["--help"]], ids=["plain", "help"])
def test_an_unknown_subcommand_is_exit_2_naming_it_and_the_closest_valid_one(help):
    line = refused("data", "nosuch", *help)
    assert line.startswith("crucible: error: crucible data: unknown command 'nosuch'"), line
    assert "did you mean '" in line, line
    line = refused("data", "prepar", *help)
    assert "unknown command 'prepar' (did you mean 'prepare'?)" in line, line
    line = refused("config", "kyes", *help)
    assert "did you mean 'keys'?" in line, line


def test_the_hidden_rank_wrapper_is_never_suggested():
    line = refused("launch-rnk")
    assert "did you mean 'launch'?" in line, line


def test_known_commands_and_their_options_still_parse():
    assert "Usage" in run_crucible("data", "prepare", "--help").stdout
    assert "Usage" in run_crucible("--help").stdout
    # An option's value that is not a command word, before the subcommand and after it.
    proc = run_crucible("config", "keys", check=False, timeout=60)
    assert proc.returncode == 0 and "job.name" in proc.stdout, proc.stderr
    proc = run_crucible("train", "--set", "nosuch.key=1", check=False, timeout=60)
    assert proc.returncode == 2 and "unknown command" not in proc.stderr, proc.stderr
