"""The log variables (GLOG_v, MS_SUBMODULE_LOG_v, GLOG_logtostderr, GLOG_log_dir, GLOG_stderrthreshold,
logger_maxBytes, logger_backupCount) and the header. The logger reads them once per process, so each case runs a
fresh interpreter with its own environment."""

import logging
import os
import re
import stat
import subprocess
import sys

import pytest

from mindspore_serving import log
from mindspore_serving.common import ms_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOG_VARIABLES = (
    "GLOG_v",
    "MS_SUBMODULE_LOG_v",
    "GLOG_logtostderr",
    "GLOG_log_dir",
    "GLOG_stderrthreshold",
    "logger_maxBytes",
    "logger_backupCount",
)
HEADER = re.compile(
    r"^\[(DEBUG|INFO|WARNING|ERROR)\] SERVING\((\d+):(\d+),MainProcess\):"
    r"\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d\.\d{3}\.\d{3} \[([^\]]+):(\d+)\] (.*)$"
)
LOGS_EACH_LEVEL = """\
from mindspore_serving import log
log.debug("debug msg test")
log.info("info msg test")
log.warning("warning msg test")
log.error("error msg test")
print("config", log.get_log_config(), flush=True)
"""
DESIRED = "{'3': 'ERROR', '2': 'WARNING', '1': 'INFO', '0': 'DEBUG'}"


def run_script(tmp_path, env, script=LOGS_EACH_LEVEL, name="caller.py"):
    """Runs `script` as tmp_path/name with only `env`'s log variables set; returns (stdout, stderr)."""
    path = tmp_path / name
    path.write_text(script)
    full_env = {k: v for k, v in os.environ.items() if k not in LOG_VARIABLES}
    full_env.update(env, PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, str(path)], env=full_env, capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    return done.stdout, done.stderr


def levels_in(text):
    return {level for level in ("DEBUG", "INFO", "WARNING", "ERROR") if f"[{level}]" in text}


@pytest.mark.parametrize(
    "glog_v, shown",
    [
        (None, {"WARNING", "ERROR"}),
        ("0", {"DEBUG", "INFO", "WARNING", "ERROR"}),
        ("1", {"INFO", "WARNING", "ERROR"}),
        ("2", {"WARNING", "ERROR"}),
        ("3", {"ERROR"}),
    ],
)
def test_glog_v_selects_the_levels(tmp_path, glog_v, shown):
    out, err = run_script(tmp_path, {} if glog_v is None else {"GLOG_v": glog_v})
    assert levels_in(err) == shown
    assert f"'GLOG_v': '{glog_v or '2'}', 'GLOG_logtostderr': '1'}}" in out


def test_header_names_process_thread_time_and_the_callers_line(tmp_path):
    script = (
        "import threading\nfrom mindspore_serving import log\nlog.warning('from the caller %s', 7)\n"
        "print(threading.get_ident(), flush=True)\n"
    )
    out, err = run_script(tmp_path, {}, script)
    (line,) = err.splitlines()
    match = HEADER.match(line)
    assert match, line
    level, _pid, tid, path, lineno, message = match.groups()
    assert (level, lineno, message) == ("WARNING", "3", "from the caller 7")
    assert path == str(tmp_path / "caller.py") and tid == out.strip()


@pytest.mark.parametrize(
    "pathname, shown",
    [
        ("/x/lib/python3.11/site-packages/mindspore_serving/worker/service.py", "mindspore_serving/worker/service.py"),
        ("/srv/servables/add/servable_config.py", "/srv/servables/add/servable_config.py"),
    ],
)
def test_header_path_starts_at_the_last_mindspore_component(pathname, shown):
    record = logging.LogRecord("mindspore_serving", logging.INFO, pathname, 70, "msg", None, None)
    assert log._Formatter().format(record).endswith(f"[{shown}:70] msg")  # pylint: disable=protected-access


@pytest.mark.parametrize(
    "glog_v, submodule, shown",
    [
        ("3", "{SERVING:0}", {"DEBUG", "INFO", "WARNING", "ERROR"}),
        ("3", "{SERVING:1}", {"INFO", "WARNING", "ERROR"}),
        ("0", "{SERVING:2}", {"WARNING", "ERROR"}),
        ("0", "{ PARSER:0 ,SERVING : 3}", {"ERROR"}),
        ("3", "{PARSER:0}", {"ERROR"}),
    ],
)
def test_ms_submodule_log_v_overrides_glog_v(tmp_path, glog_v, submodule, shown):
    out, err = run_script(tmp_path, {"GLOG_v": glog_v, "MS_SUBMODULE_LOG_v": submodule})
    assert levels_in(err) == shown
    level = {"DEBUG": "0", "INFO": "1", "WARNING": "2", "ERROR": "3"}[
        min(shown, key=["DEBUG", "INFO", "WARNING", "ERROR"].index)
    ]
    assert f"'GLOG_v': '{level}'" in out


@pytest.mark.parametrize(
    "text, expected, got",
    [
        ("SERVING:1", "{", "variable"),
        ("{SERVING:1", "}", "end-of-string"),
        ("{SERVING:1;}", "}", "invalid"),
        ("{SERVING:a}", "number", "variable"),
        ("{SERVING 1}", ":", "number"),
        ("{}", "variable", "}"),
        ("{SERVING:-1}", "number", "invalid"),
    ],
)
def test_malformed_ms_submodule_log_v_is_ignored_with_a_warning(text, expected, got):
    warnings = []
    assert log.parse_submodule_levels(text, warn=warnings.append) == {}
    assert warnings == [
        f"Parse submodule log configuration text error, expect `{expected}`, but got `{got}`. "
        f"The whole configuration will be ignored."
    ]


def test_ms_submodule_log_v_texts_that_parse():
    assert log.parse_submodule_levels("") == {}
    assert log.parse_submodule_levels("  ") == {}
    assert log.parse_submodule_levels("{PARSER:0, ANALYZER:2,\tSERVING:1}") == {
        "PARSER": "0",
        "ANALYZER": "2",
        "SERVING": "1",
    }


def test_malformed_ms_submodule_log_v_leaves_glog_v(tmp_path):
    _, err = run_script(tmp_path, {"GLOG_v": "1", "MS_SUBMODULE_LOG_v": "{SERVING:7}"})
    assert "[WARNING]" in err and "Illegal log level value 7 for SERVING, ignore it." in err
    assert levels_in(err) == {"INFO", "WARNING", "ERROR"}
    _, err = run_script(tmp_path, {"GLOG_v": "1", "MS_SUBMODULE_LOG_v": "{SERVING:0"})
    assert (
        "Parse submodule log configuration text error, expect `}`, but got `end-of-string`. The whole "
        "configuration will be ignored." in err
    )
    assert levels_in(err) == {"INFO", "WARNING", "ERROR"}


def test_logtostderr_0_writes_this_process_file_in_glog_log_dir(tmp_path):
    log_dir = tmp_path / "glog"
    log_dir.mkdir()
    script = LOGS_EACH_LEVEL + "import os\nprint('pid', os.getpid(), flush=True)\n"
    out, err = run_script(tmp_path, {"GLOG_v": "1", "GLOG_logtostderr": "0", "GLOG_log_dir": str(log_dir)}, script)
    pid = out.split("pid ")[1].strip()
    assert os.listdir(log_dir) == [f"mindspore_serving.log.{pid}"]
    text = (log_dir / f"mindspore_serving.log.{pid}").read_text()
    assert levels_in(text) == {"INFO", "WARNING", "ERROR"}
    assert all(HEADER.match(line) for line in text.splitlines())
    assert levels_in(err) == {"WARNING", "ERROR"}  # GLOG_stderrthreshold defaults to 2
    assert (
        f"config {{'GLOG_v': '1', 'GLOG_logtostderr': '0', 'GLOG_log_dir': '{log_dir}', "
        f"'logger_maxBytes': 52428800, 'logger_backupCount': 30, 'GLOG_stderrthreshold': '2'}}"
    ) in out


def test_relative_glog_log_dir_is_under_the_working_directory(tmp_path):
    (tmp_path / "logs").mkdir()
    out, _ = run_script(tmp_path, {"GLOG_logtostderr": "0", "GLOG_log_dir": "logs"})
    assert f"'GLOG_log_dir': '{os.path.realpath(tmp_path / 'logs')}'" in out
    assert len(os.listdir(tmp_path / "logs")) == 1


@pytest.mark.parametrize(
    "threshold, on_stderr",
    [
        ("0", {"DEBUG", "INFO", "WARNING", "ERROR"}),
        ("1", {"INFO", "WARNING", "ERROR"}),
        ("3", {"ERROR"}),
    ],
)
def test_glog_stderrthreshold_sends_records_to_stderr_too(tmp_path, threshold, on_stderr):
    log_dir = tmp_path / "glog"
    log_dir.mkdir()
    out, err = run_script(
        tmp_path,
        {"GLOG_v": "0", "GLOG_logtostderr": "0", "GLOG_log_dir": str(log_dir), "GLOG_stderrthreshold": threshold},
    )
    assert levels_in(err) == on_stderr
    (name,) = os.listdir(log_dir)
    assert levels_in((log_dir / name).read_text()) == {"DEBUG", "INFO", "WARNING", "ERROR"}
    assert f"'GLOG_stderrthreshold': '{threshold}'" in out


def test_logger_max_bytes_and_backup_count_rotate_the_file(tmp_path):
    log_dir = tmp_path / "glog"
    log_dir.mkdir()
    script = (
        "import os\nfrom mindspore_serving import log\nfor i in range(40):\n    log.warning('line %03d', i)\n"
        "print(os.getpid(), flush=True)\n"
    )
    out, _ = run_script(
        tmp_path,
        {
            "GLOG_logtostderr": "0",
            "GLOG_log_dir": str(log_dir),
            "logger_maxBytes": "500",
            "logger_backupCount": "2",
            "GLOG_stderrthreshold": "3",
        },
        script,
    )
    base = f"mindspore_serving.log.{out.strip()}"
    assert sorted(os.listdir(log_dir)) == [base, base + ".1", base + ".2"]
    for name in os.listdir(log_dir):
        assert 0 < os.path.getsize(log_dir / name) <= 500
    # the newest lines are in the file, the older ones in .1, then .2; backups are read-only
    assert "line 039" in (log_dir / base).read_text()
    last_backup = (log_dir / (base + ".1")).read_text().splitlines()[-1]
    assert int(last_backup[-3:]) < int((log_dir / base).read_text().splitlines()[0][-3:])
    assert stat.S_IMODE(os.stat(log_dir / (base + ".1")).st_mode) == 0o400
    assert stat.S_IMODE(os.stat(log_dir / (base + ".2")).st_mode) == 0o400
    assert stat.S_IMODE(os.stat(log_dir / base).st_mode) == 0o600


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"GLOG_v": "4"},
            f"Incorrect log level:4, Please check the configuration of GLOG_v or GLOG_stderrthreshold, "
            f"desired log level :{DESIRED}",
        ),
        (
            {"GLOG_v": "INFO"},
            f"Incorrect log level:INFO, Please check the configuration of GLOG_v or "
            f"GLOG_stderrthreshold, desired log level :{DESIRED}",
        ),
        (
            {"GLOG_stderrthreshold": "-1"},
            f"Incorrect log level:-1, Please check the configuration of GLOG_v or "
            f"GLOG_stderrthreshold, desired log level :{DESIRED}",
        ),
        (
            {"GLOG_logtostderr": "2"},
            "Incorrect value, The value of GLOG_logtostderr must be 0 or 1, Output log to console, configure to 1.",
        ),
        (
            {"GLOG_logtostderr": "0"},
            "When GLOG_logtostderr is set to 0, The directory of saving log must be set, GLOG_log_dir cannot be empty.",
        ),
        (
            {"GLOG_logtostderr": "0", "GLOG_log_dir": "/no/such/dir"},
            "The file path does not exist. GLOG_log_dir:/no/such/dir",
        ),
        (
            {"GLOG_logtostderr": "0", "GLOG_log_dir": "{tmp}", "logger_maxBytes": "50M"},
            "Incorrect value, The value of logger_maxBytes must be positive integer. logger_maxBytes:50M",
        ),
        (
            {"GLOG_logtostderr": "0", "GLOG_log_dir": "{tmp}", "logger_backupCount": "-3"},
            "Incorrect value, The value of logger_backupCount must be positive integer. logger_backupCount:-3",
        ),
    ],
)
def test_bad_values_raise_value_error(tmp_path, env, message):
    env = {key: value.replace("{tmp}", str(tmp_path)) for key, value in env.items()}
    script = (
        "from mindspore_serving import log\ntry:\n    log.info('x')\nexcept ValueError as err:\n"
        "    print(repr(str(err)))\n"
    )
    out, err = run_script(tmp_path, env, script)
    assert out.strip() == repr(message), err


def test_log_variables_without_effect_are_not_checked(tmp_path):
    """logger_* and GLOG_log_dir only count when logging to files (GLOG_logtostderr=0)."""
    out, err = run_script(tmp_path, {"GLOG_log_dir": "/no/such/dir", "logger_maxBytes": "x", "logger_backupCount": "y"})
    assert "'GLOG_logtostderr': '1'" in out and levels_in(err) == {"WARNING", "ERROR"}


def test_the_cluster_scheduler_keeps_this_process_level_for_this_package(monkeypatch):
    """MindSpore's own log in the scheduler is kept to errors; MS_SUBMODULE_LOG_v keeps SERVING at this level."""
    started = {}

    class FakePopen:
        def __init__(self, args, env, **_kwargs):
            started.update(args=args, env=env)

    monkeypatch.setattr(ms_cluster.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(ms_cluster, "wait_listening", lambda *args, **kwargs: True)
    monkeypatch.setenv("MS_SUBMODULE_LOG_v", "{PARSER:0}")
    monkeypatch.delenv("MS_SERVING_SCHEDULER_GLOG_v", raising=False)
    ms_cluster.start_scheduler(ms_cluster.ClusterAddress("127.0.0.1", 1, 2))
    assert started["env"]["GLOG_v"] == "3"
    assert started["env"]["MS_SUBMODULE_LOG_v"] == f"{{PARSER:0,SERVING:{log.get_level()}}}"


def test_control_characters_from_clients_cannot_forge_log_lines(tmp_path):
    script = (
        "from mindspore_serving import log\n"
        "log.warning('bad name %r and %s', 'x\\n[ERROR] forged', 'a\\x1b[31mred\\r\\tend')\n"
        "try:\n    raise ValueError('boom')\nexcept ValueError:\n    log.exception('failed for %s', 'q\\nq')\n"
    )
    _, err = run_script(tmp_path, {}, script)
    lines = err.splitlines()
    assert HEADER.match(lines[0]).groups()[-1] == "bad name 'x\\n[ERROR] forged' and a\\x1b[31mred\\r\tend"
    assert HEADER.match(lines[1]).groups()[-1] == "failed for q\\nq"
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "ValueError: boom"
    assert not any(line.startswith("[ERROR] forged") for line in lines)


def test_lines_logged_while_a_request_is_handled_name_its_id(tmp_path):
    script = (
        "from mindspore_serving import log\n"
        "token = log.bind_request_id('client-42')\n"
        "log.warning('refused')\n"
        "log.unbind_request_id(token)\n"
        "log.warning('later')\n"
    )
    _, err = run_script(tmp_path, {}, script)
    lines = err.splitlines()
    assert HEADER.match(lines[0]).groups()[-1] == "refused [request client-42]"
    assert HEADER.match(lines[1]).groups()[-1] == "later"


def test_an_error_raised_into_python_is_logged_at_the_exception_level(tmp_path):
    """MindSpore Serving's `[EXCEPTION]` line (the text of the error its C++ core raises), shown at every GLOG_v."""
    script = "from mindspore_serving import log\nlog.raised('Raise failed: Serving Error: x')\n"
    _, err = run_script(tmp_path, {"GLOG_v": "3"}, script)
    (line,) = err.splitlines()
    assert line.startswith("[EXCEPTION] SERVING(") and line.endswith("] Raise failed: Serving Error: x")
