"""server.distributed's pure logic: rank table parsing, the rank checks, declare_servable, startup_agents'
parameter checks and rank selection, and the agents' tensor-info checks, with MindSpore Serving's texts."""

import importlib.util
import itertools
import json
import re
import textwrap

import numpy as np
import pytest
from serving_process import free_port

from mindspore_serving.agent.distributed.startup_checks import (
    check_startup_args,
    resolve_model_files,
    select_local_ranks,
)
from mindspore_serving.server import distributed
from mindspore_serving.spec.registry import get_servable_spec, reset_registry
from mindspore_serving.worker.distributed.agent_group import RankAgent, check_agent_infos
from mindspore_serving.worker.distributed.rank_table import RankConfig, check_rank_config, parse_rank_table, stage_ranks
from mindspore_serving.worker.model_backend import TensorInfo

WORKER_ADDRESS = f"127.0.0.1:{free_port()}"  # only checked, never dialled: still a port nothing else holds

_ids = itertools.count()


def raises(text):
    return pytest.raises(RuntimeError, match=re.escape(text))


def server_list(*servers):
    return json.dumps(
        {
            "server_list": [
                {
                    "server_id": ip,
                    "device": [{"device_id": str(d), "device_ip": "10.0.0.1", "rank_id": str(r)} for d, r in devices],
                }
                for ip, devices in servers
            ]
        }
    )


# ---------------------------------------------------------------- rank table


def test_server_list_ranks_in_file_order():
    table = server_list(("10.0.0.1", [(0, 0), (1, 1)]), ("10.0.0.2", [(0, 2)]))
    assert parse_rank_table(table, "t.json") == [
        RankConfig("10.0.0.1", 0),
        RankConfig("10.0.0.1", 1),
        RankConfig("10.0.0.2", 0),
    ]


def test_group_list_ranks():
    table = json.dumps(
        {
            "group_list": [
                {
                    "instance_list": [
                        {"server_id": "10.0.0.1", "rank_id": "0", "devices": [{"device_id": "3"}]},
                        {"server_id": "10.0.0.2", "rank_id": "1", "devices": [{"device_id": "0"}]},
                    ]
                }
            ]
        }
    )
    assert parse_rank_table(table, "t.json") == [RankConfig("10.0.0.1", 3), RankConfig("10.0.0.2", 0)]


@pytest.mark.parametrize(
    "table, message",
    [
        ("[1]", "t.json is not json object"),
        ("{", "parse error:"),
        ("{}", "server_list attr is empty int.json"),
        (json.dumps({"server_list": [{"device": []}]}), "server_id attr is empty int.json"),
        (json.dumps({"server_list": [{"server_id": "a", "device": []}]}), "device attr is empty int.json"),
        (
            json.dumps({"server_list": [{"server_id": "a", "device": [{"rank_id": "0"}]}]}),
            "device_id attr is empty int.json",
        ),
        (
            json.dumps({"server_list": [{"server_id": "a", "device": [{"device_id": "x", "rank_id": "0"}]}]}),
            "device_idattr is invalid argument int.json",
        ),
        (
            json.dumps({"server_list": [{"server_id": "a", "device": [{"device_id": "0"}]}]}),
            "rank_id attr is empty int.json",
        ),
        (server_list(("a", [(0, 1)])), "device size not match rank_id int.json"),
        (json.dumps({"group_list": []}), "group_list attr is empty int.json"),
    ],
)
def test_rank_table_errors(table, message):
    with raises(message):
        parse_rank_table(table, "t.json")


def test_rank_count_must_equal_rank_size():
    ranks = [RankConfig("a", 0), RankConfig("a", 1), RankConfig("a", 2)]
    with raises("Rank size 3 declared in rank table file 't.json' not equal to 2 declared in servable config"):
        check_rank_config(ranks, 2, 1, "t.json")


def test_rank_size_must_be_a_multiple_of_stage_size():
    ranks = [RankConfig("a", i) for i in range(4)]
    with raises("Rank size must be an integral multiple of stage size, rank size: 4, stage size: 3"):
        check_rank_config(ranks, 4, 3, "t.json")


def test_device_ids_of_one_machine_are_distinct_and_below_8():
    with raises("Check rank table config failed, device id repeatedly used by rank 1 in device ip a"):
        check_rank_config([RankConfig("a", 0), RankConfig("a", 0)], 2, 1, "t.json")
    with raises("Check rank table config failed, device id cannot larger than 8"):
        check_rank_config([RankConfig("a", 8)], 1, 1, "t.json")
    check_rank_config([RankConfig("a", 0), RankConfig("b", 0)], 2, 1, "t.json")


def test_stage_ranks():
    assert stage_ranks(4, 2) == [[0, 1], [2, 3]]
    assert stage_ranks(2, 1) == [[0, 1]]


# ---------------------------------------------------------------- declare_servable


@pytest.fixture
def registry():
    reset_registry()
    yield
    reset_registry()


def load(tmp_path, body, name="svc"):
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    path = directory / "servable_config.py"
    path.write_text("from mindspore_serving.server import distributed, register\n" + textwrap.dedent(body))
    spec = importlib.util.spec_from_file_location(f"_distributed_config_{next(_ids)}", str(path))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_declare_servable_declares_a_model_keyed_by_the_servable(tmp_path, registry):
    load(
        tmp_path,
        """
        model = distributed.declare_servable(rank_size=2, stage_size=1, with_batch_dim=False)
        @register.register_method(output_names="y")
        def predict(x):
            return register.add_stage(model, x, outputs_count=1)
    """,
    )
    spec = get_servable_spec("svc")
    assert spec.distributed and spec.distributed_spec.rank_size == 2 and spec.distributed_spec.stage_size == 1
    assert spec.models["svc"].with_batch_dim is False and spec.models["svc"].io_counts == {0: (1, 1)}


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "distributed.declare_servable(2, 1)\nregister.declare_model('a.mindir', 'MindIR')",
            "Declare model failed, servable has already been declared as distributed servable",
        ),
        (
            "register.declare_model('a.mindir', 'MindIR')\ndistributed.declare_servable(2, 1)",
            "Declare distributed model failed, servable has already been declared as local servable",
        ),
        (
            "distributed.declare_servable(2, 1)\ndistributed.declare_servable(2, 1)",
            "Declare distributed model failed, servable is repeatedly been declared as distributed servable",
        ),
        ("distributed.declare_servable(0, 1)", "Parameter 'rank_size' should be >= 1"),
        ("distributed.declare_servable(2, 1, with_batch_dim=1)", "Parameter 'with_batch_dim' should be bool"),
    ],
)
def test_declare_servable_errors(tmp_path, registry, body, message):
    with raises(message):
        load(tmp_path, body)


# ---------------------------------------------------------------- startup_agents


def test_startup_args():
    assert check_startup_args(WORKER_ADDRESS, ["a", "b"], None, 7000, None, "AES-GCM") == (("a", "b"), None)
    for port in (0, 65529):
        with raises("Parameter 'agent_start_port' should be in range [1,65528]"):
            check_startup_args(WORKER_ADDRESS, ["a"], None, port, None, "AES-GCM")
    with raises("Parameter 'dec_key' length 3 expected to be 16, 24 or 32"):
        check_startup_args(WORKER_ADDRESS, ["a"], None, 7000, b"abc", "AES-GCM")
    with raises("Parameter 'dec_mode' expected to be 'AES-GCM' or 'AES-CBC'"):
        check_startup_args(WORKER_ADDRESS, ["a"], None, 7000, None, "XTS")


def test_agent_ip_and_rank_start_go_together():
    pairing = "Parameter 'agent_ip' and parameter 'rank_start' must have values at the same time, or both None"
    with raises(pairing):
        select_local_ranks(["a"], None, 0, 7000)
    with raises(pairing):
        select_local_ranks(["a"], "127.0.0.1", None, 7000)


def test_local_ranks():
    ips = ["10.0.0.1", "10.0.0.1", "10.0.0.2"]
    assert select_local_ranks(ips, None, None, 7000, lambda ip, port: ip == "10.0.0.2") == ("10.0.0.2", [2])
    assert select_local_ranks(ips, "192.168.0.9", 1, 7000, lambda ip, port: True) == ("192.168.0.9", [0, 1])
    with raises("Parameter 'rank_start' cannot equal or larger than rank size 3."):
        select_local_ranks(ips, "10.0.0.1", 3, 7000, lambda ip, port: True)
    with raises("Get local machine ip failed"):
        select_local_ranks(ips, None, None, 7000, lambda ip, port: False)


def test_model_files_per_local_rank(tmp_path):
    (tmp_path / "r0.mindir").write_bytes(b"x")
    assert resolve_model_files(["r0.mindir"], [0], str(tmp_path)) == [str((tmp_path / "r0.mindir").resolve())]
    with raises(f"Cannot access model file '{(tmp_path / 'missing.mindir').resolve()}'"):
        resolve_model_files(["missing.mindir"], [0], str(tmp_path))
    with raises("Card count [0, 1] described rank table does not equal to model files size 1"):
        resolve_model_files(["r0.mindir"], [0, 1], str(tmp_path))


# ---------------------------------------------------------------- agents' tensor infos


def agent(rank, inputs, outputs):
    def infos(shapes):
        return [TensorInfo(shape, np.dtype(np.float32)) for shape in shapes]

    return RankAgent(rank, "", infos(inputs), infos(outputs), None, None)


def test_pipeline_stage_takes_the_previous_stage_outputs():
    check_agent_infos({0: agent(0, [(4, 8)], [(4, 8), (4, 8)]), 1: agent(1, [(4, 8), (4, 8)], [(4, 8)])}, 2, 2)
    with raises("Rank 1 input infos not match the outputs of rank 0, the last rank of the previous stage"):
        check_agent_infos({0: agent(0, [(4, 8)], [(4, 8)]), 1: agent(1, [(4, 8), (4, 8)], [(4, 8)])}, 2, 2)


def test_ranks_of_a_stage_agree():
    with raises("Rank 1 input infos not match rank 0, subgraph: 0, details: Index 0 tensor not match"):
        check_agent_infos({0: agent(0, [(4, 8)], [(4, 8)]), 1: agent(1, [(2, 8)], [(4, 8)])}, 2, 1)
    with raises("Rank 1 output infos not match rank 0"):
        check_agent_infos({0: agent(0, [(4, 8)], [(4, 8)]), 1: agent(1, [(4, 8)], [(4, 4)])}, 2, 1)


def test_start_servable_checks_its_parameters(tmp_path):
    with raises("Parameter 'wait_agents_time_in_seconds' should be >= 0"):
        distributed.start_servable(str(tmp_path), "svc", "t.json", wait_agents_time_in_seconds=-1)
    with raises("Parameter 'rank_table_json_file' should be str"):
        distributed.start_servable(str(tmp_path), "svc", None)
