"""Entry of an extra worker process, started by the master as `python -m mindspore_serving.worker.start_extra_worker
...` (the name operators look for in `ps`; see extra_worker.py)."""

import sys

from mindspore_serving.worker.extra_worker import main

if __name__ == "__main__":
    sys.exit(main())
