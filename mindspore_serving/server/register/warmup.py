"""`enable_warmup`: let a worker warm a servable up with generated inputs before it counts as ready."""

from mindspore_serving.spec.registry import get_or_create_servable_spec, servable_location


def enable_warmup(generate=True):
    """Warms up, before the worker registers with the master, every method that has no warm-up file with one
    instance of zeros, when the dtype and shape of each of its inputs are known from the MindIR (inputs that go
    straight to a model stage); other methods are left out (logged at INFO).

    Warm-up files need no declaration: `<servable>/warmup/<method>.json` holding `{"instances": [...]}` in the
    RESTful request format is always run. See docs/servables.md, "Warm-up".

    Example::

        from mindspore_serving.server import register
        register.enable_warmup(generate=True)
    """
    if not isinstance(generate, bool):
        raise TypeError(f"Parameter 'generate' should be bool, but actually {type(generate).__name__}")
    _, name = servable_location()
    get_or_create_servable_spec(name).warmup_generate = generate
