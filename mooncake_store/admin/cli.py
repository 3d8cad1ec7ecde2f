"""`mooncake-admin`: the operator's command group.

Subcommands live in their own modules of this package and are registered on `main` here;
`token` (credentials) is in `admin/tokens.py`.
"""

from __future__ import annotations

import click

from mooncake_store.admin.keys import keys
from mooncake_store.admin.ops import drain, nodes, remove, stats
from mooncake_store.admin.tokens import token


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Administer a mooncake-store cluster: issue tokens, inspect and manage nodes and keys."""


main.add_command(token)
for command in (nodes, stats, keys, remove, drain):  # admin/ops.py, admin/keys.py
    main.add_command(command)


if __name__ == "__main__":
    main()
