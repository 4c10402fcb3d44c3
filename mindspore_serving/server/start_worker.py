"""Entry script of a worker process (the name that operators' scripts look for in `ps`)."""
import sys

from mindspore_serving.worker.process import main

if __name__ == "__main__":
    sys.exit(main())
