"""Render only: a run directory's results.jsonl -> summary.json (the source of truth for every other
format), junit.xml, summary.md and report.html (``render``), and run-to-run comparison (``compare``).
``rundir`` gives the runner fresh run directories and the provenance for their headers.
Nothing here imports from the harness except ``deltacheck.harness.records.results``."""
