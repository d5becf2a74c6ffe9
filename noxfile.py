"""nox sessions for deltacheck. Each passes ``*session.posargs`` through to the tool it wraps."""

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

# The CPU wheel: an unpinned torch would pull a multi-GB CUDA build on a CPU machine.
CPU_TORCH = "torch==2.13.0"


@nox.session
def tests(session):
    """The project's own tests on the CPU (what CI runs): `nox -s tests -- -k oracle`."""
    session.install(CPU_TORCH, "-e", ".[test,report]")
    session.run("python", "-m", "pytest", "-n", "2", *session.posargs)


@nox.session
def verify(session):
    """The main job on the CPU: the reference verifying itself, fused backends reported with reasons."""
    session.install(CPU_TORCH, "-e", ".[report]")
    session.run("deltacheck", "verify", *session.posargs)


@nox.session(venv_backend="none")
def gpu(session):
    """The case matrix on this machine's GPU, in the current environment (keeps its CUDA torch):
    `nox -s gpu -- --tier L0 --backend cudnn --backend fla`."""
    session.run("python", "-m", "deltacheck", "run", *session.posargs)


@nox.session(venv_backend="none")
def bench(session):
    """Benchmarks, ratios side by side in one run: `nox -s bench` (the chunked reference vs the token oracle on the
    CPU, vs FLA's fused kernels on a GPU) or `nox -s bench -- lanes [--jobs 8 ...]` (the fused lane cold then warm)."""
    if session.posargs and session.posargs[0] == "lanes":
        session.run("python", "bench/lanes.py", *session.posargs[1:])
    else:
        session.run("python", "bench/chunked.py", *session.posargs)


@nox.session
def lint(session):
    """Static checks: ruff over the whole tree."""
    session.install("ruff")
    session.run("ruff", "check", ".", *session.posargs)


@nox.session(venv_backend="none")
def release(session):
    """Qualify cuDNN frontend releases side by side: `nox -s release -- 1.31.0 1.32.0 [--tier L0] [--op kda]`.

    For each version X: a venv `.nox/release-fe-X` made by the `python` on PATH with
    `--system-site-packages` (so the GPU torch and every other library stay the ones this machine has),
    `nvidia-cudnn-frontend==X` installed into it with `--no-deps` (only the frontend differs between runs),
    then `deltacheck run --backend cudnn --tier L0 --out runs/release-X` (which makes its own timestamped run
    directory there) and `deltacheck report` on that directory;
    then `deltacheck compare` between consecutive versions, written to `runs/release-compare-A-to-B.md`.
    Other options: `--backend NAME` (repeatable, default cudnn), `-k EXPR`, `--factor 2.0` (for compare).

    Offline (a GPU machine without PyPI): on a machine with PyPI and the same platform and Python, download
    the wheels, copy the folder over, and point the session at it:

        pip download nvidia-cudnn-frontend==1.31.0 --no-deps -d wheels/
        pip download nvidia-cudnn-frontend==1.32.0 --no-deps -d wheels/
        # from another platform add: --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.12
        DELTACHECK_WHEELS=$PWD/wheels nox -s release -- 1.31.0 1.32.0

    With DELTACHECK_WHEELS set, pip runs with `--no-index --find-links $DELTACHECK_WHEELS`. Without nox, see
    docs/release.md for the same steps in plain bash.

    The session fails when a compare finds a regression (new failure, worse error, newly declined or
    errored), when a version's run writes no results, or when the newest version's run fails.
    """
    import argparse
    import itertools
    import os
    import shlex
    import subprocess
    import time
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="nox -s release --", description="qualify cuDNN frontend releases")
    parser.add_argument("versions", nargs="+", metavar="VERSION", help="nvidia-cudnn-frontend versions, oldest first")
    parser.add_argument("--tier", default="L0")
    parser.add_argument("--op", action="append", default=[], help="repeatable; default: every op")
    parser.add_argument("--backend", action="append", default=[], help="repeatable; default: cudnn")
    parser.add_argument("-k", dest="keyword", help="case id filter, passed to `deltacheck run -k`")
    parser.add_argument("--factor", default="2.0", help="`deltacheck compare --factor`")
    try:
        opts = parser.parse_args(session.posargs)
    except SystemExit as exc:
        if exc.code:
            session.error("bad arguments (see the usage above)")
        return  # --help
    backends = opts.backend or ["cudnn"]
    wheels = os.environ.get("DELTACHECK_WHEELS")
    if wheels and not Path(wheels).is_dir():
        session.error(f"DELTACHECK_WHEELS={wheels} is not a directory")

    def call(argv: list[str]) -> int:
        session.log("$ " + " ".join(shlex.quote(a) for a in argv))
        return subprocess.call(argv)

    runs_root = Path("runs")
    runs_root.mkdir(exist_ok=True)
    outcome: list[str] = []
    failed: list[str] = []
    run_dirs: list[tuple[str, Path, str]] = []  # (version, run directory, its venv's python)
    for version in opts.versions:
        venv = Path(".nox") / f"release-fe-{version}"
        session.run("python", "-m", "venv", "--clear", "--system-site-packages", str(venv), external=True)
        python = str(venv / "bin" / "python")
        source = ["--no-index", "--find-links", wheels] if wheels else []
        session.run(python, "-m", "pip", "install", "--quiet", "--no-deps", *source,
                    f"nvidia-cudnn-frontend=={version}", external=True)
        installed = session.run(python, "-c", "import importlib.metadata as m; print(m.version('nvidia-cudnn-frontend'))",
                                external=True, silent=True).strip()
        if installed != version:
            session.error(f"{venv} sees nvidia-cudnn-frontend {installed}, not {version}: the system copy shadows it")
        if call([python, "-c", "import deltacheck"]) != 0:
            session.log("deltacheck is not importable from the system site-packages; installing this checkout")
            session.run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", ".",
                        external=True)

        out = runs_root / f"release-{version}"
        if (out / "results.jsonl").exists():  # never append a new run to an old one
            aside = out.with_name(f"{out.name}.previous-{time.strftime('%Y%m%d-%H%M%S')}")
            out.rename(aside)
            session.log(f"moved the earlier {out} aside to {aside}")
        before = set(out.iterdir()) if out.is_dir() else set()
        argv = [python, "-m", "deltacheck", "run", "--tier", opts.tier, "--out", str(out)]
        for backend in backends:
            argv += ["--backend", backend]
        for op in opts.op:
            argv += ["--op", op]
        if opts.keyword:
            argv += ["-k", opts.keyword]
        run_status = call(argv)
        # `--out` is the root the run makes its own timestamped directory in; accept a run written
        # straight into it as well.
        made = sorted(p for p in (set(out.iterdir()) if out.is_dir() else set()) - before
                      if (p / "results.jsonl").is_file())
        run_dir = out if (out / "results.jsonl").is_file() else (made[-1] if made else None)
        if run_dir is None:
            failed.append(f"{version}: the run wrote no results (exit {run_status})")
            outcome.append(f"frontend {version}: no results (run exit {run_status})")
            continue
        out = run_dir
        report_status = call([python, "-m", "deltacheck", "report", str(out)])
        outcome.append(f"frontend {version}: run exit {run_status}, report exit {report_status}, "
                       f"see {out / 'summary.md'} and {out / 'report.html'}")
        if report_status != 0:
            failed.append(f"{version}: report exit {report_status}")
        if version == opts.versions[-1] and run_status != 0:
            failed.append(f"{version} (the newest): its run failed (exit {run_status}); see {out / 'summary.md'}")
        run_dirs.append((version, out, python))

    for (old_version, old_dir, _), (new_version, new_dir, python) in itertools.pairwise(run_dirs):
        md = runs_root / f"release-compare-{old_version}-to-{new_version}.md"
        status = call([python, "-m", "deltacheck", "compare", str(old_dir), str(new_dir),
                       "--factor", opts.factor, "--out", str(md)])
        outcome.append(f"compare {old_version} -> {new_version}: "
                       f"{'regression' if status == 1 else 'no regression' if status == 0 else f'exit {status}'}, see {md}")
        if status != 0:
            failed.append(f"{old_version} -> {new_version}: compare exit {status} ({'regression' if status == 1 else 'error'})")

    for line in outcome:
        session.log(line)
    if failed:
        session.error("release qualification failed: " + "; ".join(failed))



@nox.session(venv_backend="none")
def lanes(session):
    """One tier across backends that cannot share a Python environment: `nox -s lanes -- [--family jax ...]
    [--tier L0] [-- run options]`. Per family (harness/ci/families.py) a venv `.nox/lane-<family>` with
    `--system-site-packages`, the family's pins, `deltacheck run` into `runs/lanes/<family>/`; then
    `deltacheck merge --fold` of the family runs into `runs/lanes/folded` with its reports. DELTACHECK_WHEELS
    installs offline (`--no-index --find-links`). docs/ci.md lists the commands."""
    import argparse
    import os
    import subprocess
    from pathlib import Path

    from deltacheck.harness.backends.base import registered
    from deltacheck.harness.ci.families import FAMILIES, lane_commands

    parser = argparse.ArgumentParser(prog="nox -s lanes --")
    parser.add_argument("--family", action="append", choices=[f.name for f in FAMILIES])
    parser.add_argument("--tier", default="L0")
    parser.add_argument("--out", default="runs/lanes")
    args, extra = parser.parse_known_args(session.posargs)
    names = args.family or [f.name for f in FAMILIES]
    commands = lane_commands(names, set(registered()), tier=args.tier, out=args.out,
                             wheels=os.environ.get("DELTACHECK_WHEELS"), extra=tuple(x for x in extra if x != "--"))
    failed = []
    for argv in commands:
        if argv[2:4] == ["deltacheck", "merge"]:  # the family runs' directories, newest in each family's folder
            argv = [str(max((p for p in Path(a[:-len("/LATEST")]).iterdir() if (p / "results.jsonl").exists()),
                            key=lambda p: p.stat().st_mtime)) if a.endswith("/LATEST") else a for a in argv]
        session.log(" ".join(argv))
        status = subprocess.run(argv, check=False).returncode
        if status and argv[2:4] == ["deltacheck", "run"]:
            failed.append(f"{argv[-1]} family run exited {status}")  # the fold still reports what ran
        elif status:
            session.error(f"{' '.join(argv[:4])} failed with exit {status}")
    if failed:
        session.error("; ".join(failed))
