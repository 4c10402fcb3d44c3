"""MindSpore's TLS on the cluster channel (ms_cluster.cluster_ssl_settings): off without its variable, the
`set_ps_context` arguments with it, and a missing file or password named before any process starts."""

import pytest

from mindspore_serving.common import ms_cluster
from mindspore_serving.common.ms_cluster import CLIENT_PASSWORD_ENV, SERVER_PASSWORD_ENV, SSL_CONFIG_ENV


def test_off_without_the_config_variable():
    assert ms_cluster.cluster_ssl_settings({}) is None


def test_the_settings_mindspore_takes(tmp_path):
    config = tmp_path / "ssl.json"
    config.write_text("{}")
    settings = ms_cluster.cluster_ssl_settings(
        {SSL_CONFIG_ENV: str(config), SERVER_PASSWORD_ENV: "s", CLIENT_PASSWORD_ENV: "c"}
    )
    assert settings == dict(enable_ssl=True, config_file_path=str(config), client_password="c", server_password="s")


def test_a_missing_file_or_password_is_named(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="no file"):
        ms_cluster.cluster_ssl_settings({SSL_CONFIG_ENV: str(tmp_path / "none.json")})
    config = tmp_path / "ssl.json"
    config.write_text("{}")
    with pytest.raises(RuntimeError, match=CLIENT_PASSWORD_ENV):
        ms_cluster.cluster_ssl_settings({SSL_CONFIG_ENV: str(config), SERVER_PASSWORD_ENV: "s"})
    with pytest.raises(RuntimeError, match=f"{SERVER_PASSWORD_ENV} and {CLIENT_PASSWORD_ENV}"):
        ms_cluster.cluster_ssl_settings({SSL_CONFIG_ENV: str(config)})
    monkeypatch.setenv(SSL_CONFIG_ENV, str(tmp_path / "none.json"))
    with pytest.raises(RuntimeError, match="no file"):  # the starter sees it before the scheduler starts
        ms_cluster.start_scheduler(ms_cluster.ClusterAddress("127.0.0.1", 1, 2))
