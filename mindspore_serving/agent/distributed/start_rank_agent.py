"""Entry of a rank agent process of `server.distributed`, started by startup_agents as
`python -m mindspore_serving.agent.distributed.start_rank_agent ...`."""

from mindspore_serving.common.native_protobuf import prefer_native_protobuf

prefer_native_protobuf()  # before protobuf is imported (see the module)

# pylint: disable=wrong-import-position
from mindspore_serving.agent.distributed.rank_agent import main  # noqa: E402

if __name__ == "__main__":
    main()
