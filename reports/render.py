"""Write every report file of one run directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .html import render_html
from .junit import render_junit
from .load import Run, load_run
from .markdown import render_markdown
from .summary import summarize, to_json

REPORT_FILES = ("summary.json", "junit.xml", "summary.md", "report.html")


@dataclass
class Written:
    run: Run
    summary: dict[str, Any]
    files: list[Path]


def write_reports(run_dir: str | Path, out_dir: str | Path | None = None, *, warn: bool = True) -> Written:
    """Render summary.json, junit.xml, summary.md and report.html for ``run_dir`` (into ``out_dir``,
    by default the run directory itself). Raises ``load.RunInputError`` for an unreadable run."""
    run = load_run(run_dir, warn=warn)
    summary = summarize(run)
    target = Path(out_dir) if out_dir is not None else run.directory
    target.mkdir(parents=True, exist_ok=True)
    texts = {
        "summary.json": to_json(summary),
        "junit.xml": render_junit(run, summary["required_failures"]),
        "summary.md": render_markdown(summary),
        "report.html": render_html(run, summary),
    }
    files = []
    for name in REPORT_FILES:
        path = target / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(texts[name], encoding="utf-8")
        tmp.replace(path)  # a reader never sees half a report
        files.append(path)
    return Written(run, summary, files)
