"""Check a directory of generated kernels against the plan: an op whose kernel
is missing, or differs from what `gen` renders now, is a finding."""

from __future__ import annotations

import json
import os
import re

from ..codegen import MANIFEST, render
from ..codegen.render import MAX_SHARDS
from ..diagnostics import Finding, rules
from ..errors import InputError
from ..files import read_text
from ..plan import Plan

_KERNEL = re.compile(r"^// (aten::\S+)  \(", re.M)


def _kernels(text: str) -> dict[str, str]:
    """op -> kernel text (from its marker comment to the closing brace at column 0)."""
    out = {}
    starts = [(m.start(), m.group(1)) for m in _KERNEL.finditer(text)]
    for (pos, op), nxt in zip(starts, starts[1:] + [(len(text), None)]):
        block = text[pos:nxt[0]]
        end = block.find("\n}\n")
        out[op] = block[: end + 3] if end >= 0 else block
    return out


def check(plan: Plan, directory: str) -> list[Finding]:
    manifest = os.path.join(directory, MANIFEST)
    try:
        with open(manifest, encoding="utf-8") as fh:
            shards = json.load(fh)["shards"]
        if isinstance(shards, bool) or not isinstance(shards, int):
            raise TypeError(shards)
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(directory, None, f"no readable {MANIFEST}: not a torchgen-patch output directory",
                         "generate it with `torchgen-patch gen --out DIR`") from None
    if not 1 <= shards <= MAX_SHARDS:
        raise InputError(manifest, None, f"'shards' is {shards}, not between 1 and {MAX_SHARDS}",
                         "regenerate the directory with `torchgen-patch gen --out DIR`")
    want = render(plan, shards)
    have: dict[str, str] = {}
    for name in want:
        p = os.path.join(directory, name)
        if name.startswith("ADInplaceOrViewPatch_") and os.path.isfile(p):
            have.update(_kernels(read_text(p, "generated kernel file")))
    expected: dict[str, str] = {}
    for name, data in want.items():
        if name.startswith("ADInplaceOrViewPatch_"):
            expected.update(_kernels(data.decode()))
    fs = []
    pattern = re.compile(r"ADInplaceOrViewPatch_(\d+)\.cpp")
    for name in sorted(os.listdir(directory)):
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) >= shards:
            fs.append(rules.stale_file(os.path.join(directory, name), MANIFEST, shards))
    for k in plan.kernels:
        if k.op not in have:
            fs.append(rules.kernel_missing(k.loc, k.op, directory))
        elif have[k.op] != expected[k.op]:
            fs.append(rules.kernel_stale(k.loc, k.op, directory))
    return fs
