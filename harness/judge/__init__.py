"""Judging one task: the checks it owes, the metric and limits, the reference side, the runner."""
