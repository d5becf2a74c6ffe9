"""``python -m deltacheck.harness.worker``: the crash-isolated worker process of a run (see ``pool``)."""

import sys

from deltacheck.harness.pool import worker_main

if __name__ == "__main__":
    sys.exit(worker_main())
