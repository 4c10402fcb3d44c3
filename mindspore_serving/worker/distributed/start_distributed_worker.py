"""Entry of the distributed worker process, started by the master as
`python -m mindspore_serving.worker.distributed.start_distributed_worker ...` (the name operators look for in `ps`)."""

from mindspore_serving.common.native_protobuf import prefer_native_protobuf

prefer_native_protobuf()  # before protobuf is imported (see the module)

# pylint: disable=wrong-import-position
import sys  # noqa: E402

from mindspore_serving.worker.distributed.process import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
