"""The rules docs/architecture.md states, each checked where it can fail: import rules in a fresh interpreter
(in this one, other tests have imported everything already), the one-way flow over the source's imports, and
the reports working in a virtual environment that has no torch at all."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from child_env import ENV

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Folders in the order data flows: a module may import from its own folder or one to its left, never right.
FLOW = ["cases", "reference", "harness", "reports"]
COMMANDS = ("deltacheck.harness.commands", "deltacheck.reports.cli", "deltacheck.harness.cli")


def fresh(code: str, *, block_torch: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter; ``block_torch``: importing torch (or numpy, matplotlib) raises there."""
    prelude = ""
    if block_torch:
        prelude = (
            "import sys\n"
            "class _Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'numpy', 'matplotlib'):\n"
            "            raise ImportError(f'blocked for this test: {name}')\n"
            "sys.meta_path.insert(0, _Block())\n"
        )
    return subprocess.run([sys.executable, "-c", prelude + code], env=ENV, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved against its package)."""
    package = "deltacheck." + ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    package = package.rstrip(".")
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                names.append(node.module)
    return names


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", FLOW)
def test_data_flows_one_way(folder):
    right = {f"deltacheck.{f}" for f in FLOW[FLOW.index(folder) + 1:]}
    offenders = [f"{path.relative_to(ROOT)} imports {name}" for path in _sources(folder) for name in _imports(path)
                 if any(name == r or name.startswith(r + ".") for r in right)]
    assert not offenders, offenders


# harness/'s rooms, in the order data flows: a module imports only from its own room or one to its left. The same
# table drives /work/notes/regroup.py, which moves the flat modules into harness/<room>/; the rule is checked on
# either layout (a flat module's room by its name, a regrouped one's by its folder).
ROOMS = {
    "records": ("results", "exitrule", "cachedir"),
    "machine": ("environment", "availability", "cores", "leaks", "devices", "versions"),
    "ci": ("known", "required", "shards", "tiers", "families"),
    "judge": ("checks", "compare", "expected", "margins", "reductions", "segments", "runner", "serving_inputs",
              "serving_checks", "invariance_checks"),
    "run": ("task", "tally", "session", "rundir", "pool", "worker", "execute", "frontier", "serving_run"),
}
ROOM_OF = {name: room for room, names in ROOMS.items() for name in names}


def _room(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[:2] != ["deltacheck", "harness"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ROOMS else ROOM_OF.get(parts[2])


def _modules_imported(path: Path) -> list[str]:
    """Like ``_imports``, and ``from pkg import mod`` also names ``pkg.mod`` (``from . import compare``)."""
    package = "deltacheck." + ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def test_harness_rooms_flow_one_way():
    offenders = []
    for path in _sources("harness"):
        mine = _room("deltacheck." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
        if mine is None:
            continue
        for name in _modules_imported(path):
            theirs = _room(name)
            if theirs is not None and list(ROOMS).index(theirs) > list(ROOMS).index(mine):
                offenders.append(f"{path.relative_to(ROOT)} ({mine}) imports {name} ({theirs})")
    assert not offenders, offenders


def test_no_module_imports_a_command():
    """Commands (harness/commands/, reports/cli.py, the CLI itself) import the code they drive, never the reverse."""
    offenders = []
    for folder in FLOW:
        for path in _sources(folder):
            name = "deltacheck." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if name.startswith(COMMANDS):
                continue
            offenders += [f"{path.relative_to(ROOT)} imports {imp}" for imp in _imports(path)
                          if imp.startswith(COMMANDS)]
    assert not offenders, offenders


def _private_imports(path: Path) -> list[str]:
    """``from M import _name`` in ``path`` where M is not in ``path``'s own package: another package's internals."""
    package = "deltacheck." + ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        if base.rpartition(".")[0] == package or base == package:
            continue  # a sibling module of the same package may share its helpers
        found += [f"{base}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_packages_private_names():
    """An adapter that converts as another does imports a shared public module (backends/layouts.py), never the
    other adapter's ``_helpers``: those may change with that adapter alone."""
    offenders = [f"{path.relative_to(ROOT)} imports {name}" for folder in FLOW for path in _sources(folder)
                 for name in _private_imports(path)]
    offenders += [f"plugin.py imports {name}" for name in _private_imports(ROOT / "plugin.py")]
    assert not offenders, offenders


MAX_MODULE_LINES = 400  # "keep modules under ~400 lines" (the project's charter)
# Modules allowed over the limit while someone splits them (module -> who): each entry leaves this list with that
# split; the test below fails while one lingers. Empty since reference/chunked*.py were split (issue 28).
OVER_WHILE_BEING_SPLIT: dict[str, str] = {}


def _module_lines() -> dict[str, int]:
    """Lines per product module: the package's folders and its top-level modules (not tests/, not bench/)."""
    paths = [p for folder in FLOW for p in _sources(folder)] + sorted(ROOT.glob("*.py"))
    return {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}


def test_no_product_module_is_over_400_lines():
    over = {path: n for path, n in _module_lines().items() if n > MAX_MODULE_LINES and path not in OVER_WHILE_BEING_SPLIT}
    assert not over, f"split these by meaning (docs/architecture.md lists each module's one job): {over}"


def test_the_size_allowlist_holds_only_modules_still_over():
    lines = _module_lines()
    done = [path for path in OVER_WHILE_BEING_SPLIT if lines.get(path, 0) <= MAX_MODULE_LINES]
    assert not done, f"{done} are within {MAX_MODULE_LINES} lines now (or gone): remove them from OVER_WHILE_BEING_SPLIT"


def test_reference_imports_torch_only():
    proc = fresh(
        "import sys\n"
        "import deltacheck.reference as r\n"
        "mods = sorted(m for m in sys.modules if m.startswith('deltacheck.') and not m.startswith('deltacheck.reference'))\n"
        "print('OTHER', mods)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "OTHER []" in proc.stdout, proc.stdout
    for path in _sources("reference"):
        # the fused kernel's Triton is optional: imported under try, absent in CI (tests/test_chunked_fused.py)
        optional = {"triton"} if path.name == "chunked_fused.py" else set()
        third_party = {n.split(".")[0] for n in _imports(path)} - {"deltacheck", "torch", "__future__"} - optional
        assert third_party <= set(sys.stdlib_module_names), (path, third_party - set(sys.stdlib_module_names))


def test_reports_and_the_case_grammar_import_without_torch():
    """Every reports module, the case-id grammar and the exit rule import with torch blocked."""
    modules = ["deltacheck.reports." + p.stem for p in _sources("reports") if p.stem != "__init__"]
    modules += ["deltacheck.cases.spec", "deltacheck.harness.records.exitrule", "deltacheck.harness.records.results"]
    proc = fresh("import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
                 + "print('OK')\n", block_torch=True)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr


@pytest.mark.parametrize("command", ["report", "compare", "merge"])
def test_report_commands_start_without_torch(command):
    proc = fresh(f"from deltacheck.harness.cli import main\nraise SystemExit(main([{command!r}, '--help']))\n",
                 block_torch=True)
    assert proc.returncode == 0, proc.stderr
    assert "usage: deltacheck " + command in proc.stdout


def test_every_command_help_matches_its_module():
    """The one-line help `deltacheck --help` prints without importing a command is the command's own."""
    import argparse

    from deltacheck.harness.cli import COMMANDS, build_parser

    parser = build_parser(every=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    real = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(real) == set(COMMANDS)
    assert {name: help_text for name, (_, help_text) in COMMANDS.items()} == real


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A virtual environment with nothing installed: no torch, no numpy, no matplotlib."""
    where = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(where)
    python = where / ("Scripts" if os.name == "nt" else "bin") / "python"
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert probe.returncode != 0, "the bare venv sees torch: the test would prove nothing"
    return python


def test_report_compare_and_merge_run_in_a_venv_without_torch(bare_python, tmp_path):
    """`deltacheck report RUN_DIR` (and compare, merge) where only the Python standard library exists."""
    link = tmp_path / "path"
    link.mkdir()
    (link / "deltacheck").symlink_to(ROOT, target_is_directory=True)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(link), "CI": "1"}
    import shutil

    run_a, run_b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(FIXTURES / "fe-1.31.0", run_a)
    shutil.copytree(FIXTURES / "fe-1.32.0", run_b)

    def dc(*argv):
        return subprocess.run([str(bare_python), "-m", "deltacheck", *argv], env=env, capture_output=True,
                              text=True, timeout=300)

    report = dc("report", str(run_b))
    assert report.returncode == 0, report.stderr
    assert (run_b / "summary.md").is_file() and (run_b / "report.html").is_file()
    compare = dc("compare", str(run_a), str(run_b))
    assert compare.returncode in (0, 1) and "Environment changes" in compare.stdout, compare.stderr
    merged = dc("merge", str(run_b), str(run_b), "--out", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
