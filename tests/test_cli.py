"""`vidchat` on the PATH (the console script the set-up installs): serving
with app.py's options, `replay` and `client` as sub-commands, `--version`;
and `python app.py` / `python -m vidchat.replay` keep working."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.unit

VIDCHAT = Path(sys.executable).parent / "vidchat"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VIDCHAT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_console_script_is_installed_beside_the_python_that_runs_the_tests():
    assert VIDCHAT.is_file(), "scripts/setup.sh installs the package (pip install -e), which makes bin/vidchat"


def test_version_names_the_installed_package():
    from importlib import metadata

    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"vidchat {metadata.version('vidchat')}"


def test_help_lists_the_sub_commands_and_every_serving_option():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    assert "vidchat replay" in out.stdout and "vidchat client" in out.stdout
    assert "usage: vidchat" in out.stdout and "--engine-restarts" in out.stdout and "--log-format" in out.stdout
    served = run("serve", "--help")
    assert served.returncode == 0 and "--engine-restarts" in served.stdout


@pytest.mark.parametrize("command, word", [("replay", "--ask"), ("client", "--url")])
def test_the_sub_commands_are_the_python_m_tools(command, word):
    out = run(command, "--help")
    assert out.returncode == 0, out.stderr
    as_module = subprocess.run([sys.executable, "-m", f"vidchat.{command}", "--help"], capture_output=True,
                               text=True, timeout=120, cwd=ROOT)
    options = lambda text: set(re.findall(r"--[a-z][a-z-]+", text))  # noqa: E731
    assert options(out.stdout) == options(as_module.stdout) and word in out.stdout


def test_an_unknown_command_is_refused_with_the_usage():
    out = run("serv")
    assert out.returncode == 2 and "unknown command 'serv'" in out.stderr and "vidchat replay" in out.stderr
