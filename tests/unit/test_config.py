"""Units and the config loader: defaults < file < env < flags, with actionable errors."""

import pytest

from mooncake_store.common.config import load_config
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.units import format_size, parse_duration, parse_size
from mooncake_store.master.config import MasterConfig
from mooncake_store.node.config import NodeConfig


@pytest.mark.parametrize(
    "text,expected",
    [
        ("512MiB", 512 * 2**20),
        ("1GiB", 2**30),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        (" 16 KiB ", 16384),
        ("2m", 2 * 2**20),
        ("64K", 65536),
        ("1G", 2**30),
        (7, 7),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("30s", 30.0),
        ("250ms", 0.25),
        ("2min", 120.0),
        ("5", 5.0),
        (1.5, 1.5),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["", "12XB", "-1", "GiB", "1..2MB"])
def test_bad_sizes_say_what_to_write(bad):
    with pytest.raises(InvalidArgumentError, match="like 512MiB"):
        parse_size(bad)


def test_format_size():
    assert format_size(512) == "512 B"
    assert format_size(3 * 2**30) == "3.0 GiB"


def test_precedence(tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text('port = 6000\nlease-ttl-s = "2s"\ndata_dir = "/from/file"\n')
    env = {"MOONCAKE_MASTER_PORT": "7000", "MOONCAKE_MASTER_HEARTBEAT_TTL_S": "20s"}
    config = load_config(
        MasterConfig,
        env_prefix="MOONCAKE_MASTER_",
        config_file=cfg,
        overrides={"port": 8000, "host": None},
        environ=env,
    )
    assert config.port == 8000  # flag beats env beats file
    assert config.lease_ttl_s == 2.0  # file beats default
    assert config.heartbeat_ttl_s == 20.0  # env
    assert config.data_dir == "/from/file"
    assert config.host == "127.0.0.1"  # unset flag does not override


def test_unknown_setting_and_bad_values(tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(InvalidArgumentError, match="unknown setting 'prot'"):
        load_config(MasterConfig, env_prefix="X_", config_file=cfg, environ={})
    with pytest.raises(InvalidArgumentError, match="MOONCAKE_NODE_DRAM_BYTES"):
        load_config(
            NodeConfig, env_prefix="MOONCAKE_NODE_", environ={"MOONCAKE_NODE_DRAM_BYTES": "lots"}
        )
    with pytest.raises(InvalidArgumentError, match="at least 1MiB"):
        NodeConfig(dram_bytes=10)
    with pytest.raises(InvalidArgumentError, match="must exceed heartbeat_interval_s"):
        MasterConfig(heartbeat_interval_s=5, heartbeat_ttl_s=2)
    with pytest.raises(InvalidArgumentError, match="host:port"):
        NodeConfig(master="localhost")


def test_framed_port_and_sync_commits_settings():
    assert MasterConfig().framed_port == 0 and MasterConfig().sync_commits is False
    assert MasterConfig().sync_interval_s == 0.1  # the default window mode
    assert MasterConfig(framed_port=-1).framed_port == -1  # gRPC only
    for bad in (-2, 65536):
        with pytest.raises(InvalidArgumentError, match="framed_port must be 0-65535"):
            MasterConfig(framed_port=bad)
    on = load_config(MasterConfig, env_prefix="M_", environ={"M_SYNC_COMMITS": "true"})
    assert on.sync_commits is True
    window = load_config(MasterConfig, env_prefix="M_", environ={"M_SYNC_INTERVAL_S": "250ms"})
    assert window.sync_interval_s == 0.25
    with pytest.raises(InvalidArgumentError, match="sync_interval_s must be >= 0"):
        MasterConfig(sync_interval_s=-1)
    with pytest.raises(InvalidArgumentError, match="M_SYNC_COMMITS"):
        load_config(MasterConfig, env_prefix="M_", environ={"M_SYNC_COMMITS": "sometimes"})
