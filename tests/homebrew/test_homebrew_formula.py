"""The Homebrew formula generator, on a small pip report made the way the README says
(this folder is not named `packaging`: that would shadow the `packaging` library).

pip-report-macos-arm64.json is pip's report for `localradix[mlx]` on an Apple-silicon Mac, cut
down to four dependencies (real wheel URLs and hashes from PyPI). Homebrew itself cannot run
here (no macOS); `ruby -c` checks the syntax where Ruby is installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = Path(__file__).with_name("pip-report-macos-arm64.json")
RELEASE = "https://example.org/releases/localradix-0.1.0-py3-none-any.whl"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "generate_formula", ROOT / "packaging/homebrew/generate_formula.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _render(report: dict) -> str:
    return gen.render(report, RELEASE, "ab" * 32, "https://example.org/localradix")


def _report() -> dict:
    return json.loads(REPORT.read_text())


def test_one_resource_per_resolved_wheel(tmp_path, capsys):
    assert gen.main([str(REPORT), "--url", RELEASE, "--sha256", "ab" * 32, "--homepage", "x"]) == 0
    formula = capsys.readouterr().out
    resources = re.findall(
        r'resource "([^"]+)" do\n    url "([^"]+)", using: :nounzip\n    sha256 "([0-9a-f]{64})"',
        formula,
    )
    pinned = {
        i["metadata"]["name"]: (i["download_info"]["url"], i["download_info"]["archive_info"])
        for i in _report()["install"][1:]
    }
    # exactly what pip resolved, mlx and its Metal library included, torch (cpu extra) not
    assert sorted(name for name, _, _ in resources) == ["mlx", "mlx-metal", "numpy", "tqdm"]
    for name, url, sha in resources:
        assert (url, sha) == (pinned[name][0], pinned[name][1]["hashes"]["sha256"])
    assert "include Language::Python::Virtualenv" in formula
    assert 'depends_on "python@3.12"' in formula
    assert "depends_on arch: :arm64" in formula and "depends_on :macos" in formula
    assert f'url "{RELEASE}", using: :nounzip' in formula and 'version "0.1.0"' in formula
    assert "${" not in formula and not re.search(r"nvidia|cuda|manylinux|torch", formula)
    if shutil.which("ruby") is None:
        pytest.skip("Ruby is not installed here: `ruby -c` not run (apt-get install ruby)")
    path = tmp_path / "localradix.rb"
    path.write_text(formula)
    check = subprocess.run(["ruby", "-c", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "Syntax OK" in check.stdout, check.stderr


def test_a_report_resolved_on_linux_is_refused():
    """pip evaluates markers on the host even with --platform: resolved on Linux for a Mac,
    the report lacks mlx's Metal library; its Mac wheels do not run on the Linux it names."""
    report = _report()
    report["install"] = [i for i in report["install"] if i["metadata"]["name"] != "mlx-metal"]
    with pytest.raises(gen.ReportError, match="lacks it.*make the report on the platform"):
        _render(report)
    linux = copy.deepcopy(_report())
    linux["environment"].update(sys_platform="linux", platform_system="Linux")
    linux["environment"]["platform_machine"] = "x86_64"
    with pytest.raises(gen.ReportError, match="does not run on linux"):
        _render(linux)


def test_local_or_unhashed_artifacts_are_refused():
    report = _report()
    report["install"][4]["download_info"]["url"] = "file:///opt/wheels/tqdm-4.67.1-py3-none-any.whl"
    with pytest.raises(gen.ReportError, match="not a downloadable wheel"):
        _render(report)
    report = _report()
    del report["install"][3]["download_info"]["archive_info"]["hashes"]
    with pytest.raises(gen.ReportError, match="no sha256"):
        _render(report)
