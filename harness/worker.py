"""``python -m deltacheck.harness.worker``: the crash-isolated worker process of a run."""

import sys

from deltacheck.harness.orchestrate import worker_main

if __name__ == "__main__":
    sys.exit(worker_main())
