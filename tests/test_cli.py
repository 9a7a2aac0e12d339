"""The `localradix` CLI: fast help without torch, flags generated from ServerArgs, registry."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from localradix import cli
from localradix.config import ServerArgs, args_from_namespace

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import sys, io, contextlib
from localradix.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main({argv!r})
    except SystemExit as e:
        code = e.code
heavy = sorted(m for m in ("torch", "numpy", "uvicorn", "litestar", "zmq", "transformers")
               if m in sys.modules)
print(code, ",".join(heavy))
print(out.getvalue())
"""


def run_cli_check(argv: list[str]) -> tuple[str, str]:
    r = subprocess.run(
        [sys.executable, "-c", CHECK.format(argv=argv)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    status, _, output = r.stdout.partition("\n")
    return status, output


@pytest.mark.parametrize(
    "argv", [["--help"], ["serve", "--help"], ["tui", "--help"], ["up", "--help"]]
)
def test_help_is_fast_and_imports_no_torch(argv):
    status, output = run_cli_check(argv)
    code, heavy = status.split(" ", 1) if " " in status else (status, "")
    assert code in ("0", "None")
    assert "torch" not in heavy and "uvicorn" not in heavy and "litestar" not in heavy
    assert "usage: localradix" in output


def test_help_lists_subcommands():
    _, output = run_cli_check(["--help"])
    for name in ("serve", "bench", "doctor", "tui", "up"):
        assert name in output


def test_up_is_the_default_command_and_takes_a_model():
    from localradix import cli

    assert cli.DEFAULT_COMMAND == "up"
    ns = cli.build_parser().parse_args(["up", "--model", "m.gguf"])
    assert ns.command == "up"


def test_serve_has_a_flag_for_every_server_arg():
    _, output = run_cli_check(["serve", "--help"])
    for f in dataclasses.fields(ServerArgs):
        if f.name != "model":
            assert "--" + f.name.replace("_", "-") in output, f.name
    assert "MODEL" in output or "model" in output


def test_serve_arguments_become_server_args():
    parser = cli.build_parser()
    ns = parser.parse_args(
        ["serve", "m.gguf", "--port", "9000", "--api-key", "k", "--cors-origins", "http://a"]
    )
    args = args_from_namespace(ns)
    assert args.model == "m.gguf" and args.port == 9000 and args.api_key == "k"
    assert args.cors_origins == ("http://a",) and args.host == "127.0.0.1"


def test_defaults_are_safe():
    args = args_from_namespace(cli.build_parser().parse_args(["serve"]))
    assert args.host == "127.0.0.1" and args.api_key is None and args.cors_origins == ()


def test_a_missing_subcommand_module_is_skipped(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "ghost", cli.Command("localradix.no_such_module", "a", "r"))
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["ghost"])


def test_a_subcommand_is_one_registry_entry(monkeypatch, tmp_path):
    mod = tmp_path / "lr_hello_cmd.py"
    mod.write_text(
        "def add(sub):\n    sub.add_parser('hello')\ndef run(ns):\n    print('hi')\n    return 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "hello", cli.Command("lr_hello_cmd", "add", "run"))
    assert cli.main(["hello"]) == 3


def test_python_dash_m_localradix_version():
    r = subprocess.run(
        [sys.executable, "-m", "localradix", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0 and "localradix" in r.stdout
