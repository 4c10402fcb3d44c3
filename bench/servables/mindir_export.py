"""What the bench servables' export_model.py scripts share: export a network to MindIR on CPU, check the file by
loading it back against numpy, and the `--force` command line."""

import argparse
import os

import numpy as np


def export_checked(build_net, numpy_forward, model_path: str, input_shape, tolerance: float) -> list:
    """Exports `build_net()` for float32 inputs of `input_shape` to `model_path` (replacing it), loads it back with
    GraphCell and compares with `numpy_forward` on seeded inputs; returns [model_path]."""
    import mindspore as ms

    from mindspore_serving.common.ms_device import select_device

    select_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    os.makedirs(os.path.dirname(model_path), exist_ok=True)
    if os.path.exists(model_path):
        os.chmod(model_path, 0o644)
        os.remove(model_path)
    ms.export(
        build_net(),
        ms.Tensor(np.zeros(input_shape, np.float32)),
        file_name=model_path[: -len(".mindir")],
        file_format="MINDIR",
    )
    os.chmod(model_path, 0o644)  # MindSpore writes it read-only for the owner
    graph = ms.nn.GraphCell(ms.load(model_path))
    x = np.random.default_rng(1).standard_normal(input_shape).astype(np.float32)
    np.testing.assert_allclose(graph(ms.Tensor(x)).asnumpy(), numpy_forward(x), rtol=tolerance, atol=tolerance)
    print(f"exported {model_path}")
    return [model_path]


def command_line(main, doc: str):
    """`export_model.py [--force]`: runs main(force)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="re-export even if the file exists")
    main(parser.parse_args().force)
