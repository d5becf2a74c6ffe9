"""The run directory's records and the one exit rule: standard library only (the reports read them)."""
