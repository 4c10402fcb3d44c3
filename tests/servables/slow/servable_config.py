"""A servable without models whose stage takes as long as asked (for lifecycle tests)."""

import os
import time

import numpy as np

from mindspore_serving.server import register


def wait_and_echo(seconds):
    marker = os.environ.get("SLOW_STAGE_STARTED")
    if marker:  # tests wait on this file instead of guessing when the stage has started
        with open(marker, "a", encoding="utf-8") as stream:
            stream.write(f"{os.getpid()}\n")
    time.sleep(float(np.asarray(seconds).reshape(-1)[0]))  # ok-sleep: the stage under test is slow on purpose
    return seconds


@register.register_method(output_names=["y"])
def sleep(seconds):
    y = register.add_stage(wait_and_echo, seconds, outputs_count=1)
    return y
