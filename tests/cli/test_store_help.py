"""The store's subcommands are listed, and their help loads neither torch nor huggingface-hub."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = """
import sys, io, contextlib
from localradix.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main({argv!r})
    except SystemExit:
        pass
print(",".join(m for m in ("torch", "huggingface_hub", "transformers") if m in sys.modules))
print(out.getvalue())
"""


def help_of(argv: list[str]) -> tuple[str, str]:
    r = subprocess.run(
        [sys.executable, "-c", CHECK.format(argv=argv)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    heavy, _, output = r.stdout.partition("\n")
    return heavy, output


def test_help_lists_the_store_commands():
    heavy, output = help_of(["--help"])
    assert heavy == ""
    for name in ("pull", "ls", "rm", "alias", "run", "ps"):
        assert f"    {name} " in output, name


@pytest.mark.parametrize("command", ["pull", "ls", "rm", "alias", "run", "ps"])
def test_subcommand_help_is_light(command):
    heavy, output = help_of([command, "--help"])
    assert heavy == "" and f"usage: localradix {command}" in output
