"""Every option of every console script has help text, and a default unless it is a flag."""

from __future__ import annotations

import re

import click
import pytest

from mooncake_store.admin.cli import main as admin
from mooncake_store.cluster import main as cluster
from mooncake_store.master.cli import main as master
from mooncake_store.node.cli import main as node


def commands() -> list[tuple[str, click.Command]]:
    out = [("mooncake-master", master), ("mooncake-store", node), ("mooncake-cluster", cluster)]
    assert isinstance(admin, click.Group)
    for name, command in admin.commands.items():
        subs = command.commands.items() if isinstance(command, click.Group) else [("", command)]
        out += [(f"mooncake-admin {name} {sub}".strip(), c) for sub, c in subs]
    return out


@pytest.mark.parametrize("name,command", commands(), ids=[n for n, _ in commands()])
def test_every_option_has_help_and_a_default(name, command):
    ctx = click.Context(command, info_name=name)
    for param in command.params:
        if not isinstance(param, click.Option) or param.name == "help":
            continue
        record = param.get_help_record(ctx)
        assert record and record[1].strip(), f"{name} {param.opts} has no help text"
        flag_only = param.is_flag and not param.secondary_opts
        states_default = "default" in record[1] or re.search(r"\[[^\]]+\]\.?$", record[1])
        assert flag_only or param.required or states_default, (
            f"{name} {param.opts} does not say its default: {record[1]!r}"
        )
