"""The README's and docs/' commands keep working: one-shot commands run and succeed; daemons' documented flags exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = [README] + [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
# Commands that run until stopped or need a cluster: their documented flags are checked, they are not run.
DAEMONS = {"extender", "node-agent", "mps-daemon", "device-plugin", "operator", "gate", "doctor"}
GNNSCHED = [sys.executable, "-c", "from gnnsched.cli import main; main()"]


def _bash_blocks() -> list[str]:
    return [block for text in DOCS for block in re.findall(r"```bash\n(.*?)```", text, re.S)]


def _commands() -> list[list[str]]:
    """Every `gnnsched ...` invocation in a bash block (line continuations joined, comments dropped)."""
    commands = []
    for block in _bash_blocks():
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("gnnsched "):
                    commands.append(shlex.split(part)[1:])
    return commands


COMMANDS = _commands()


def test_exactly_two_setup_commands_and_the_first_runs_the_simulator():
    try_it = README.split("## Try it", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", try_it, re.S)
    assert blocks[0].strip().endswith("gnnsched simulate") and "pip install torch==2.13.0" in blocks[0]
    assert blocks[1].strip() == ". .venv/bin/activate && pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\npytest -q" in ci and "pip install --quiet --disable-pip-version-check torch==2.13.0" in ci


def test_readme_documents_every_subcommand():
    for name in ("estimate", "worker", "predictor", "simulate", "extender", "node-agent", "device-plugin", "gate"):
        assert any(c and c[0] == name for c in COMMANDS) or f"gnnsched {name}" in "".join(DOCS), name


def test_docs_pages_are_linked_from_the_readme():
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in README, page.name


@pytest.mark.parametrize(
    "argv", [c for c in COMMANDS if c and c[0] in DAEMONS], ids=lambda c: " ".join(c)[:60]
)
def test_daemon_flags_in_the_readme_exist(argv):
    help_text = subprocess.run(GNNSCHED + [argv[0], "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert help_text.returncode == 0, help_text.stderr
    for flag in (a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")):
        assert flag in help_text.stdout, f"{flag} is documented for `gnnsched {argv[0]}` but not accepted"


ONE_SHOT = [
    c for c in COMMANDS
    if c and c[0] not in DAEMONS and not any(a.endswith(".yaml") and not (ROOT / a).exists() for a in c)
]


@pytest.mark.parametrize("argv", ONE_SHOT, ids=lambda c: " ".join(c)[:60])
def test_one_shot_commands_run(argv, tmp_path):
    argv = [a.replace("out/", str(tmp_path) + "/").replace("plots/", str(tmp_path) + "/plots/") for a in argv]
    argv = [str(tmp_path / "out.json") if a == "out.json" else a for a in argv]
    if argv[0] == "simulate" and "--no-progress" not in argv:
        argv.append("--no-progress")
    done = subprocess.run(GNNSCHED + argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, (argv, done.stderr[-2000:])
    assert done.stdout.strip()
