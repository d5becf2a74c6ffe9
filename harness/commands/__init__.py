"""The harness's subcommands (`run`, `verify`, `env`), each registering itself with ``add_cli(subparsers)``.

Nothing outside this package imports from it: the pytest plugin and the reports use the modules beneath
(task, required, rundir, pool), never a command."""
