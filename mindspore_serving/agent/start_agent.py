"""Entry of an agent process: `python -m mindspore_serving.agent.start_agent --config ... --rank r ...`
(the name operators look for in `ps`)."""

import sys

from mindspore_serving.agent.process import main

if __name__ == "__main__":
    sys.exit(main())
