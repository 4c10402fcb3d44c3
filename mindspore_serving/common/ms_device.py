"""Choosing MindSpore's device once per process, tolerating a runtime that is already running on it."""


def select_device(target: str = "CPU", device_id=None):
    """`mindspore.set_device(target, device_id)` and GRAPH_MODE.

    MindSpore refuses set_device once its runtime has started (e.g. a test process that already ran a
    kernel); that is fine when the runtime already runs on `target`, and an error otherwise."""
    import mindspore as ms
    try:
        ms.set_device(target, None if target == "CPU" else device_id)
    except RuntimeError:
        if ms.get_context("device_target") != target:
            raise
    ms.set_context(mode=ms.GRAPH_MODE)
