"""Export every bundled example model whose MindIR files are missing.

    python servables/export_models.py            # only what is missing (quick when nothing is)
    python servables/export_models.py --force    # re-export everything
    python servables/export_models.py add lenet  # restrict to some servables

Each servable directory has an export_model.py with MODEL_FILES, VERSION_DIR and main(); main() sets the MindSpore
context itself (CPU, GRAPH_MODE), writes the files into <servable>/1/ and verifies them. MindSpore is imported only
when something has to be exported. The LLM exporters (REUSES_GRAPHS) keep the graphs of an earlier export of the same
network and weights and compile only the new ones; --force compiles everything.
"""

import argparse
import importlib.util
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVABLES = [
    "add",
    "add_sub",
    "matmul",
    "lenet",
    "llama_tiny",
    "llama_tiny_spec",
    "llama_tiny_tp2",
    "matmul_distributed",
]


def load_module(name, path):
    """Import a script by file path under a private module name (kept in sys.modules: MindSpore's graph parser
    looks the module of a Cell up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def exporter(servable):
    return load_module(f"_servables_{servable}_export_model", os.path.join(HERE, servable, "export_model.py"))


def missing_files(servable):
    """Paths of the servable's exported files that do not exist."""
    module = exporter(servable)
    return [
        os.path.join(module.VERSION_DIR, f)
        for f in module.MODEL_FILES
        if not os.path.isfile(os.path.join(module.VERSION_DIR, f))
    ]


def _lenet_images_missing():
    images = os.path.join(HERE, "lenet", "images")
    return not os.path.isdir(images) or not any(f.endswith(".png") for f in os.listdir(images))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="re-export even if the files exist")
    parser.add_argument(
        "servables", nargs="*", default=[], help=f"servables to export (default: all of {', '.join(SERVABLES)})"
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.servables if s not in SERVABLES]
    if unknown:
        parser.error(f"unknown servable(s) {', '.join(unknown)}; choose from {', '.join(SERVABLES)}")
    selected = args.servables or SERVABLES
    exported = {}
    for servable in selected:
        module = exporter(servable)
        missing = [f for f in module.MODEL_FILES if not os.path.isfile(os.path.join(module.VERSION_DIR, f))]
        stale = None if missing or args.force else getattr(module, "stale", lambda: None)()
        if not missing and not stale and not args.force:
            print(f"{servable}: up to date ({', '.join(module.MODEL_FILES)})")
            continue
        reason = "forced" if args.force else stale or f"missing {', '.join(missing)}"
        print(f"{servable}: exporting ({reason})", flush=True)
        start = time.time()
        forced = args.force and getattr(module, "REUSES_GRAPHS", False)  # else it keeps graphs it can reuse
        exported[servable] = module.main(reuse=False) if forced else module.main()
        print(f"{servable}: done in {time.time() - start:.1f} s", flush=True)
    if "lenet" in selected and _lenet_images_missing():
        print("lenet: writing the example digit images", flush=True)
        load_module("_servables_lenet_make_images", os.path.join(HERE, "lenet", "make_images.py")).main()
    if not exported:
        print("nothing to export")
    return exported


if __name__ == "__main__":
    main()
    sys.exit(0)
