"""A servable without models whose stage takes as long as asked (for lifecycle tests)."""
import time

import numpy as np

from mindspore_serving.server import register


def wait_and_echo(seconds):
    time.sleep(float(np.asarray(seconds).reshape(-1)[0]))  # ok-sleep: the stage under test is slow on purpose
    return seconds


@register.register_method(output_names=["y"])
def sleep(seconds):
    y = register.add_stage(wait_and_echo, seconds, outputs_count=1)
    return y
