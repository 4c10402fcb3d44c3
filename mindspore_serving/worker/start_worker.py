"""Entry of a worker process, started by the master as `python -m mindspore_serving.worker.start_worker ...`
(the name operators look for in `ps`)."""

import sys

from mindspore_serving.worker.process import main

if __name__ == "__main__":
    sys.exit(main())
