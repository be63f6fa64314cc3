"""Check a directory of generated kernels against the plan: an op whose kernel
is missing, or differs from what `gen` renders now, is a finding."""

from __future__ import annotations

import os
import re

from ..codegen import MANIFEST, render
from ..codegen.output import snapshot
from ..codegen.render import MAX_SHARDS
from . import Finding, rules
from ..errors import InputError
from ..files import decode, load_json
from ..plan import Plan

_KERNEL = re.compile(r"^// (aten::\S+)  \(", re.M)


def _kernels(text: str) -> dict[str, str]:
    """op -> kernel text (from its marker comment to the closing brace at column 0)."""
    out = {}
    starts = [(m.start(), m.group(1)) for m in _KERNEL.finditer(text)]
    for (pos, op), nxt in zip(starts, starts[1:] + [(len(text), None)], strict=False):  # no start: the end alone
        block = text[pos:nxt[0]]
        end = block.find("\n}\n")
        out[op] = block[: end + 3] if end >= 0 else block
    return out


def check(plan: Plan, directory: str) -> list[Finding]:
    """The directory is whole and current: every file is the one gen renders from ``plan`` now, byte
    for byte (never judged by the manifest's own hashes, which an edit can update), the register
    file registers exactly the plan's kernels, and each kernel is the one gen renders now. Only the
    number of shards is taken from the manifest. The files are one snapshot, read under gen's lock
    through one open directory (a gen writing meanwhile is never seen half-way)."""
    if not os.path.isdir(directory):
        raise InputError(directory, None, "--generated is not a directory")
    files = snapshot(directory)
    manifest = os.path.join(directory, MANIFEST)
    try:
        text = files.get(MANIFEST)
        doc = load_json(text, manifest, MANIFEST, "generate it again with `torchgen-patch gen --out DIR`") \
            if text is not None else None
        shards = doc["shards"]  # type: ignore[index]  # None: the TypeError below
        if isinstance(shards, bool) or not isinstance(shards, int):
            raise TypeError(shards)
    except (ValueError, KeyError, TypeError):
        raise InputError(directory, None, f"no readable {MANIFEST}: not a torchgen-patch output directory",
                         "generate it with `torchgen-patch gen --out DIR`") from None
    if not 1 <= shards <= MAX_SHARDS:
        raise InputError(manifest, None, f"'shards' is {shards}, not between 1 and {MAX_SHARDS}",
                         "regenerate the directory with `torchgen-patch gen --out DIR`")
    want = render(plan, shards)
    fs = []
    for name in sorted(want):
        if name not in files:
            fs.append(rules.file_missing(os.path.join(directory, name)))
        elif files[name] != want[name]:
            fs.append(rules.file_modified(os.path.join(directory, name), "differs from what gen writes for this plan"))
    have: dict[str, str] = {}
    for name in want:
        if name.startswith("ADInplaceOrViewPatch_") and name in files:
            have.update(_kernels(_text(directory, name, files[name])))
    expected: dict[str, str] = {}
    for name, data in want.items():
        if name.startswith("ADInplaceOrViewPatch_"):
            expected.update(_kernels(data.decode()))
    pattern = re.compile(r"ADInplaceOrViewPatch_(\d+)\.cpp")
    for name in sorted(files):
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) >= shards:
            fs.append(rules.stale_file(os.path.join(directory, name), MANIFEST, shards))
    for k in plan.kernels:
        if k.op not in have:
            fs.append(rules.kernel_missing(k.loc, k.op, directory))
        elif have[k.op] != expected[k.op]:
            fs.append(rules.kernel_stale(k.loc, k.op, directory))
    if REGISTER in files:
        registered = _registered(_text(directory, REGISTER, files[REGISTER]))
        planned = {k.name for k in plan.kernels}
        if registered != planned:
            fs.append(rules.registration_mismatch(os.path.join(directory, REGISTER), sorted(planned - registered),
                                                  sorted(registered - planned)))
    return fs


REGISTER = "RegisterADInplaceOrViewPatch.cpp"
_ENTRY = re.compile(r'^    \{"([^"]+)", \[\]\(torch::Library& m\)', re.M)


def _registered(text: str) -> set[str]:
    return set(_ENTRY.findall(text))


def _text(directory: str, name: str, data: bytes) -> str:
    return decode(os.path.join(directory, name), data, "generated file")
