"""The `mindspore-serving` command's argument handling: the command dispatch, where `serve` finds the servables,
and the scripts serving_server.py / start_agent.py taking the same flags."""

import argparse
import os
import subprocess
import sys

import pytest

from mindspore_serving import cli
from mindspore_serving.cli import agent, serve
from mindspore_serving.spec.hf_serving import HfModelError
from mindspore_serving.worker.llm import hf_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_command_name_picks_the_main_and_the_rest_are_its_flags():
    command, args, prog = cli.split_command(["serve", "--grpc", "127.0.0.1:0", "--servables", "add"])
    assert command is serve.main and args == ["--grpc", "127.0.0.1:0", "--servables", "add"]
    assert prog == "mindspore-serving serve"
    command, args, prog = cli.split_command(["agent", "--config", "x.yaml"])
    assert command is agent.main and args == ["--config", "x.yaml"] and prog == "mindspore-serving agent"


@pytest.mark.parametrize("argv", [[], ["bogus"], ["--grpc", "127.0.0.1:0"]])
def test_a_missing_or_unknown_command_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.split_command(argv)
    assert exit_info.value.code == 2
    assert "usage: mindspore-serving" in capsys.readouterr().err


def test_help_lists_the_commands_and_version_prints_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.split_command(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "serve" in out and "agent" in out
    with pytest.raises(SystemExit):
        cli.split_command(["--version"])
    assert capsys.readouterr().out.strip() == f"mindspore-serving {cli.__version__}"


def test_serve_reads_servables_under_the_current_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, args = serve.parse_args([])
    assert args.servable_directory == os.path.join(str(tmp_path), "servables")
    # MindSpore Serving's example ports, only parsed here (nothing listens)
    assert (args.grpc.rsplit(":", 1), args.rest.rsplit(":", 1)) == (["127.0.0.1", "5500"], ["127.0.0.1", "1500"])
    assert args.servables is None


def test_serve_resolves_a_relative_servable_directory_against_its_base(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, args = serve.parse_args(["--servable_directory", "models"])
    assert args.servable_directory == os.path.join(str(tmp_path), "models")
    base = tmp_path / "repo"
    _, args = serve.parse_args(["--servable_directory", "models"], base_directory=str(base))
    assert args.servable_directory == os.path.join(str(base), "models")
    _, args = serve.parse_args([], base_directory=str(base))
    assert args.servable_directory == os.path.join(str(base), "servables")
    _, args = serve.parse_args(["--servable_directory", "/srv/servables"], base_directory=str(base))
    assert args.servable_directory == "/srv/servables"


def test_serve_errors_name_the_program(capsys):
    with pytest.raises(SystemExit):
        serve.parse_args(["--restricted_api"], prog="mindspore-serving serve")
    assert capsys.readouterr().err.startswith("usage: mindspore-serving serve")


def test_agent_requires_a_configuration(capsys):
    with pytest.raises(SystemExit) as exit_info:
        agent.build_parser("mindspore-serving agent").parse_args([])
    assert exit_info.value.code == 2
    assert "--config" in capsys.readouterr().err
    args = agent.build_parser().parse_args(["--config", "c.yaml", "--rank_start", "1"])
    assert (args.config, args.rank_start, args.scheduler_address) == ("c.yaml", 1, "")


@pytest.mark.parametrize("script,command", [("serving_server.py", "serve"), ("start_agent.py", "agent")])
def test_the_scripts_take_the_commands_flags(script, command):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    parser = serve.build_parser("servables") if command == "serve" else agent.build_parser()
    flags = {
        option
        for action in parser._actions
        if action.help != argparse.SUPPRESS  # the removed flags, taken only to be refused
        for option in action.option_strings
    }
    assert result.stdout.startswith(f"usage: {script}")
    assert all(flag in result.stdout for flag in flags)
    if command == "serve":
        assert "--max_num_seqs" in flags and "--max_num_batched_tokens" in flags
        assert not any(f"--{flag}" in result.stdout for flag in serve.REMOVED_FLAGS)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--prepare_only"], "go with --model"),
        (["--model", "a", "--model", "b", "--served_model_name", "x"], "give one name per model"),
        (["--model", "a", "--model_control", "poll"], "not poll"),
        (["--model", "a", "--tensor_parallel", "2", "--device_ids", "0,1,2"], "one device id per rank"),
    ],
)
def test_serve_refuses_model_flags_that_do_not_fit_before_starting_anything(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve.main(argv, prog="mindspore-serving serve")
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["decode_batch_buckets", "prefill_batch_buckets", "prefill_len_buckets"])
def test_serve_refuses_the_removed_bucket_flags_saying_what_replaced_them(flag, capsys):
    assert flag in serve.REMOVED_FLAGS
    with pytest.raises(SystemExit) as exit_info:
        serve.main(["--model", "a", f"--{flag}", "1,2"], prog="mindspore-serving serve")
    assert exit_info.value.code == 2
    assert (
        f"--{flag} was removed: the model's graphs take any batch and prompt length (dynamic shapes); "
        f"--max_num_seqs and --max_num_batched_tokens bound a step"
    ) in capsys.readouterr().err


def test_serve_gives_the_step_bounds_to_each_model(monkeypatch):
    prepared = []

    def prepare_all(models, log):
        prepared.extend(models)
        raise HfModelError("stopped here")

    monkeypatch.setattr(hf_model, "prepare_all", prepare_all)
    argv = ["--model", "a", "--model", "b", "--served_model_name", "a", "--served_model_name", "b"]
    with pytest.raises(SystemExit, match="--model stopped here"):
        serve.main(argv + ["--max_num_seqs", "8", "--max_num_batched_tokens", "256"], prog="mindspore-serving serve")
    assert [(m.max_num_seqs, m.max_num_batched_tokens) for m in prepared] == [(8, 256), (8, 256)]
    prepared.clear()
    with pytest.raises(SystemExit, match="--model stopped here"):
        serve.main(argv, prog="mindspore-serving serve")
    assert [(m.max_num_seqs, m.max_num_batched_tokens) for m in prepared] == [(None, None)] * 2  # the defaults
    with pytest.raises(SystemExit, match="--model a: max_num_batched_tokens must be an int >= 1, got 0"):
        serve.main(["--model", "a", "--max_num_batched_tokens", "0"], prog="mindspore-serving serve")
