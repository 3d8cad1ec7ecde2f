"""The client SDK's modules reach each other only through public names: no module under
mooncake_store/client reads or writes another class's private (underscore) attribute.

The sync Client drives the operations through `ClientFlows` (client/flows.py), the interface
both clients share, not through AsyncClient's internals.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mooncake_store.client as client_package

CLIENT_DIR = Path(client_package.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_attributes(cls: ast.ClassDef) -> set[str]:
    """What a class defines for itself: class-body names and `self.X = ...` in its methods."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                if t.value.id == "self":
                    names.add(t.attr)
    return names


def foreign_private_accesses(source: str) -> list[str]:
    """`obj._x` where `obj` is not self/cls and `_x` is not an attribute of the enclosing class
    (another instance of the same class may be touched: `channel._transport` in a factory)."""
    found: list[str] = []

    def visit(node: ast.AST, own: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            own = _own_attributes(node)
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            is_self = isinstance(base, ast.Name) and base.id in ("self", "cls")
            if not is_self and node.attr not in own:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, own)

    visit(ast.parse(source), set())
    return found


def test_no_client_module_uses_another_class_private_attribute():
    offenders = {
        path.name: hits
        for path in sorted(CLIENT_DIR.glob("*.py"))
        if (hits := foreign_private_accesses(path.read_text()))
    }
    assert offenders == {}


def test_the_check_catches_a_reach_into_another_object():
    bad = (
        "class Client:\n"
        "    def put(self):\n"
        "        return self._async._put_flow()\n"
        "def helper(client):\n"
        "    return client._master\n"
    )
    assert foreign_private_accesses(bad) == [
        "line 3: self._async._put_flow",
        "line 5: client._master",
    ]
    same_class = (
        "class Channel:\n"
        "    def __init__(self):\n"
        "        self._transport = None\n"
        "    @classmethod\n"
        "    def connect(cls):\n"
        "        channel = cls()\n"
        "        channel._transport = 1\n"
        "        return channel\n"
    )
    assert foreign_private_accesses(same_class) == []


def test_the_sync_client_drives_the_public_flows():
    from mooncake_store.client.flows import ClientFlows

    source = (CLIENT_DIR / "sync_client.py").read_text()
    used = {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_flows"
    }
    assert used, "the sync Client should run the operations of its ClientFlows"
    assert not any(_private(name) for name in used)
    assert all(hasattr(ClientFlows, name) for name in used - {"shm"})
