"""Units and the config loader: defaults < file < env < flags, with actionable errors."""

import dataclasses

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
    with pytest.raises(InvalidArgumentError, match=r"--heartbeat-ttl \S+ must exceed"):
        MasterConfig(heartbeat_interval_s=5, heartbeat_ttl_s=2)
    with pytest.raises(InvalidArgumentError, match="host:port"):
        NodeConfig(master="localhost")


def test_framed_port_and_sync_commits_settings():
    assert MasterConfig().framed_port == 0 and MasterConfig().sync_commits is False
    assert MasterConfig().sync_interval_s == 0.1  # the default window mode
    assert MasterConfig(framed_port=-1).framed_port == -1  # gRPC only
    for bad in (-2, 65536):
        with pytest.raises(InvalidArgumentError, match="--framed-port must be 0-65535"):
            MasterConfig(framed_port=bad)
    on = load_config(MasterConfig, env_prefix="M_", environ={"M_SYNC_COMMITS": "true"})
    assert on.sync_commits is True
    window = load_config(MasterConfig, env_prefix="M_", environ={"M_SYNC_INTERVAL": "250ms"})
    assert window.sync_interval_s == 0.25
    with pytest.raises(InvalidArgumentError, match="--sync-interval must be >= 0"):
        MasterConfig(sync_interval_s=-1)
    with pytest.raises(InvalidArgumentError, match="M_SYNC_COMMITS"):
        load_config(MasterConfig, env_prefix="M_", environ={"M_SYNC_COMMITS": "sometimes"})


def test_one_name_per_setting_in_flags_file_and_env(tmp_path, caplog):
    """`--dram`, `dram = ...` and MOONCAKE_NODE_DRAM are the same setting; old names warn."""
    cfg = tmp_path / "n.toml"
    cfg.write_text('dram = "64MiB"\nnvme-dir = "/x"\nnvme = "2MiB"\nmount_timeout = "2s"\n')
    config = load_config(NodeConfig, env_prefix="MOONCAKE_NODE_", config_file=cfg, environ={})
    assert (config.dram_bytes, config.nvme_bytes, config.mount_timeout_s) == (64 << 20, 2 << 20, 2)
    env = {"MOONCAKE_NODE_DRAM": "32MiB"}
    assert load_config(NodeConfig, env_prefix="MOONCAKE_NODE_", environ=env).dram_bytes == 32 << 20
    # The field names of before still work, with a deprecation warning naming the new one.
    cfg.write_text('dram_bytes = "16MiB"\n')
    with caplog.at_level("WARNING", logger="mooncake.config"):
        old = load_config(NodeConfig, env_prefix="MOONCAKE_NODE_", config_file=cfg, environ={})
        assert old.dram_bytes == 16 << 20
        env = {"MOONCAKE_NODE_DRAM_BYTES": "8MiB"}
        assert load_config(NodeConfig, env_prefix="MOONCAKE_NODE_", environ=env).dram_bytes == (
            8 << 20
        )
    assert "'dram_bytes' is deprecated, write 'dram'" in caplog.text
    assert "$MOONCAKE_NODE_DRAM_BYTES is deprecated, set $MOONCAKE_NODE_DRAM" in caplog.text


def test_bad_values_name_the_real_flag(tmp_path):
    with pytest.raises(InvalidArgumentError, match="bad value for --dram:"):
        load_config(NodeConfig, env_prefix="N_", overrides={"dram_bytes": "lots"}, environ={})
    with pytest.raises(InvalidArgumentError, match="bad value for --lease-ttl:"):
        load_config(MasterConfig, env_prefix="M_", overrides={"lease_ttl_s": "x"}, environ={})
    with pytest.raises(InvalidArgumentError, match=r"--dram must be at least 1MiB"):
        NodeConfig(dram_bytes=10)
    cfg = tmp_path / "m.toml"
    cfg.write_text("lease_tl = 1\n")
    with pytest.raises(InvalidArgumentError, match="did you mean 'lease_ttl'"):
        load_config(MasterConfig, env_prefix="M_", config_file=cfg, environ={})


def test_misspelt_mooncake_variables_are_warned_about(caplog):
    env = {
        "MOONCAKE_NODE_DRAMM": "1GiB",  # typo of a node setting
        "MOONCAKE_NODES_DRAM": "1GiB",  # typo of the prefix
        "MOONCAKE_MASTER_PORT": "1",  # the other daemon's: not ours to judge
        "MOONCAKE_EVENT_LOOP": "asyncio",  # read elsewhere
        "MOONCAKE_NODE_DRAM": "8MiB",
    }
    with caplog.at_level("WARNING", logger="mooncake.config"):
        load_config(NodeConfig, env_prefix="MOONCAKE_NODE_", environ=env)
    assert "MOONCAKE_NODE_DRAMM (did you mean MOONCAKE_NODE_DRAM?)" in caplog.text
    assert "unknown environment variable MOONCAKE_NODES_DRAM" in caplog.text
    assert "MOONCAKE_MASTER_PORT" not in caplog.text and "EVENT_LOOP" not in caplog.text


@pytest.mark.parametrize("cls", [MasterConfig, NodeConfig])
def test_every_setting_has_help_and_a_flag(cls):
    import click

    from mooncake_store.common.config import config_options, flag_name

    @click.command()
    @config_options(cls, "X_")
    def cmd(**flags):
        pass

    opts = {p.name: p for p in cmd.params}
    for field in dataclasses.fields(cls):
        assert field.metadata.get("help"), f"{field.name} has no help text"
        option = opts[field.name]
        assert flag_name(field) in option.opts or flag_name(field) in option.secondary_opts
        assert "[default: " in option.help


def test_gpu_watermarks_and_copy_timeout_are_settable():
    env = {"M_GPU_HIGH_WATERMARK": "0.8", "M_GPU_LOW_WATERMARK": "0.5", "M_COPY_TIMEOUT": "7s"}
    config = load_config(MasterConfig, env_prefix="M_", environ=env)
    assert (config.gpu_high_watermark, config.gpu_low_watermark, config.copy_timeout_s) == (
        0.8, 0.5, 7.0,
    )  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="--gpu-low-watermark"):
        MasterConfig(gpu_low_watermark=0.95)


@pytest.mark.parametrize("cls", [MasterConfig, NodeConfig])
def test_every_flag_is_in_the_readme(cls):
    from pathlib import Path

    from mooncake_store.common.config import flag_name

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    missing = [
        flag_name(f)
        for f in dataclasses.fields(cls)
        if f"`{flag_name(f)}`" not in readme and f"`--no-{flag_name(f)[2:]}`" not in readme
    ]
    assert not missing, f"README.md does not document {missing}"


def test_node_timeouts_and_message_caps_are_settings(tmp_path):
    """Once hard-coded in node/: same defaults, now flag == TOML key == env, checked."""
    default = NodeConfig()
    assert (default.grpc_max_message_bytes, default.master_max_message_bytes) == (
        64 << 20,
        256 << 20,
    )
    assert (
        default.master_call_timeout_s,
        default.drain_call_timeout_s,
        default.drain_stall_s,
        default.unmount_timeout_s,
        default.fetch_timeout_s,
    ) == (1.0, 5.0, 3.0, 2.0, 30.0)
    cfg = tmp_path / "n.toml"
    cfg.write_text('master-call-timeout = "3s"\nfetch_timeout = "10s"\n')
    env = {"N_GRPC_MAX_MESSAGE_BYTES": "128MiB", "N_DRAIN_STALL": "500ms"}
    config = load_config(
        NodeConfig,
        env_prefix="N_",
        config_file=cfg,
        environ=env,
        overrides={"unmount_timeout_s": "4s", "master_max_message_bytes": "1GiB"},
    )
    assert config.master_call_timeout_s == 3.0 and config.fetch_timeout_s == 10.0
    assert config.grpc_max_message_bytes == 128 << 20 and config.drain_stall_s == 0.5
    assert config.unmount_timeout_s == 4.0 and config.master_max_message_bytes == 1 << 30
    with pytest.raises(InvalidArgumentError, match="--drain-call-timeout must be > 0"):
        NodeConfig(drain_call_timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="--grpc-max-message-bytes must be 1MiB-2GiB"):
        NodeConfig(grpc_max_message_bytes=4 << 30)
