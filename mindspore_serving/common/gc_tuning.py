"""The garbage collector of a serving process once it serves.

A request allocates hundreds of container objects (JSON values, protobuf wrappers, coroutines, futures), so with
CPython's default threshold (a young-generation pass every 700 allocations) the collector runs every few requests,
and every tenth pass of those walks the older generation too: the imported libraries (MindSpore's are large), the
loaded servable, the servers. `settle()` takes everything alive at that point out of the collector's sight
(`gc.freeze`: it is never freed, and is not meant to be) and lets young passes come less often. Garbage that forms
reference cycles is still collected, a little later.
"""

import gc

YOUNG_THRESHOLD = 20000
"""Allocations (less deallocations) of tracked objects between two young-generation passes; CPython's is 700."""


def settle() -> None:
    """Call once the process has loaded what it keeps for its lifetime (again after loading more)."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:  # 0: the collector is switched off, and stays so
        gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
