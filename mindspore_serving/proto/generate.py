"""Regenerates the Python modules of the .proto files in this folder.

    python mindspore_serving/proto/generate.py [--out DIR] [NAME.proto ...]

Without names every .proto of the folder is compiled. The protos import each other by bare file name
(`import "ms_service.proto";`), so protoc's output says `import ms_service_pb2`; that import is rewritten
to the package-relative `from . import ms_service_pb2` so the modules work inside `mindspore_serving.proto`.
"""

import argparse
import glob
import os
import re
import sys

PROTO_DIR = os.path.dirname(os.path.abspath(__file__))
_BARE_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def _protoc_include() -> str:
    import grpc_tools  # pylint: disable=import-outside-toplevel

    return os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")


def fix_imports(path: str):
    with open(path, encoding="utf-8") as file:
        text = file.read()
    fixed = _BARE_IMPORT.sub(r"from . import \1 as \2", text)
    if fixed != text:
        with open(path, "w", encoding="utf-8") as file:
            file.write(fixed)


def generate(protos=None, out_dir: str = PROTO_DIR):
    from grpc_tools import protoc  # pylint: disable=import-outside-toplevel

    if not protos:
        protos = sorted(os.path.basename(p) for p in glob.glob(os.path.join(PROTO_DIR, "*.proto")))
    os.makedirs(out_dir, exist_ok=True)
    for proto in protos:
        name = os.path.basename(proto)
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{_protoc_include()}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            name,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {name}")
        stem = name[: -len(".proto")]
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            fix_imports(os.path.join(out_dir, stem + suffix))
        print(f"generated {stem}_pb2.py and {stem}_pb2_grpc.py in {out_dir}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=PROTO_DIR, help="output folder (default: this folder)")
    parser.add_argument("protos", nargs="*", help="proto file names in this folder (default: all)")
    args = parser.parse_args(argv)
    generate(args.protos, args.out)


if __name__ == "__main__":
    sys.exit(main())
