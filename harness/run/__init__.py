"""The run engine: task, tally, session, run directory, pool and worker, execute, the frontier search."""
