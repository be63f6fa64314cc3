"""Bounds on hostile yaml, checked around torchgen's own loader and parse: entries, keys per mapping,
aliases (a list or mapping reached twice), schema length, operator names, duplicates."""

from __future__ import annotations

import functools
import re

from ..errors import InputError, printable


# Bounds on hostile input (tests/test_adversarial_yaml.py): several times what PyTorch's yaml needs
MAX_ENTRIES = 10_000
MAX_KEYS = 256  # per mapping: torchgen's loader checks duplicate keys in a list, quadratic in the keys


@functools.lru_cache(maxsize=None)
def bounded(base: type) -> type:
    """The toolchain's own loader, refusing a mapping of more than MAX_KEYS keys before it is built."""
    import yaml

    def construct_mapping(self, node, deep=False):
        if len(node.value) > MAX_KEYS:
            raise yaml.constructor.ConstructorError(None, None, f"a mapping of {len(node.value):,} keys (the "
                                                    f"limit is {MAX_KEYS})", node.start_mark)
        return base.construct_mapping(self, node, deep=deep)  # type: ignore[attr-defined]  # a yaml Loader's

    return type(f"Bounded{base.__name__}", (base,), {"construct_mapping": construct_mapping})


_CONTAINERS = (dict, list, tuple)  # what a safe loader makes that can hold a container (!!pairs: tuples)


def refuse_shared(path: str, es: list, what: str) -> None:
    """Refuse a list or mapping reached twice: only YAML aliases (``*name``) do that, and they can
    stand for a billion elements in a few lines ("billion laughs"), which torchgen would walk or
    print in a message. PyTorch's yaml uses none. One pass over the containers (a few percent of a parse)."""
    seen: set[int] = set()
    for entry in es:
        todo = [entry]
        for node in todo:  # grows while it is walked
            if id(node) in seen:
                raise InputError(path, entry.get("__line__"), f"YAML aliases (*name) are not allowed in {what}",
                                 "write the value out where it is used")
            seen.add(id(node))
            for v in (node.values() if type(node) is dict else node):
                if type(v) in _CONTAINERS:
                    todo.append(v)


def line_of_named_entry(msg: str, es: list) -> int | None:
    """torchgen's cross-entry checks name the schema but not its line: find it."""
    for e in es:
        func = e.get("func")
        if isinstance(func, str) and func.strip() in msg:
            return e.get("__line__")
    return None


MAX_SCHEMA = 10_000
_OPERATOR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?\Z")


def check_duplicates(path: str, es: list) -> None:
    seen: dict[str, int] = {}
    for e in es:
        func = e.get("func")
        if not isinstance(func, str):
            raise InputError(path, e.get("__line__"), "entry has no 'func:' schema string")
        line = e.get("__line__")
        if len(func) > MAX_SCHEMA:  # torchgen's parse of one such line takes seconds per megabyte
            raise InputError(path, line, f"a schema of {len(func):,} characters (the limit is {MAX_SCHEMA:,}; "
                                         "PyTorch's longest has about 500)")
        name = func.split("(", 1)[0].strip()
        if not _OPERATOR_NAME.match(name):  # torchgen accepts ev"il(...); C++ string literals would not
            raise InputError(path, line, f"operator name {printable(repr(name))} is not an identifier "
                                         "(with an optional .overload)", "names are letters, digits and '_'")
        if name in seen:
            raise InputError(path, line, f"duplicate operator '{name}'", f"first defined at line {seen[name]}")
        seen[name] = line
