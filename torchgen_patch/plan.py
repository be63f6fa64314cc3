"""Plan: which kernels to emit, with which template, in which shard.

The plan is the one source of truth shared by gen, build, install, verify,
lint and diff. Every decision is made here; templates only arrange text.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from .errors import InputError
from .model import MISSING, UNSUPPORTED, CppSig, OpRecord, Scan, WrittenArg
from .overlay import Overlay

DEFAULT_TEMPLATE = "kernel.cpp.j2"


@dataclass(frozen=True)
class Kernel:
    op: str  # aten::split_with_sizes_copy.out
    name: str  # split_with_sizes_copy.out (as registered in the aten namespace)
    fn: str  # C++ function name
    schema: str
    yaml_name: str  # basename of the yaml, never an absolute path
    line: int
    template: str
    formals: tuple[tuple[str, str], ...]
    call_args: tuple[str, ...]
    unambiguous_name: str
    root_name: str
    written: tuple[WrittenArg, ...]
    xfail_devices: tuple[str, ...] | None = None  # None: expected to pass; () everywhere
    xfail_reason: str | None = None

    def shard(self, n: int) -> int:
        return stable_hash(self.op) % n

    @property
    def declaration(self) -> str:
        """The kernel's C++ declarator: the dispatcher signature, keyset first."""
        args = ", ".join(["c10::DispatchKeySet ks"] + [f"{t} {n}" for t, n in self.formals])
        return f"void {self.fn}({args})"


@dataclass(frozen=True)
class LeftOut:
    op: str
    file: str
    line: int
    why: str


@dataclass
class Plan:
    kernels: list[Kernel] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    torch_version: str = ""

    def ops(self) -> list[str]:
        return [k.op for k in self.kernels]


def stable_hash(key: str) -> int:
    """A hash that is the same in every process (never Python's hash())."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "little")


def make_plan(scan: Scan, overlay: Overlay, strict: bool = False, cpp: dict | None = None) -> Plan:
    """``cpp``: C++ signatures by op (default: load.cpp_signatures(scan))."""
    if cpp is None:
        from .load import cpp_signatures

        cpp = cpp_signatures(scan)
    plan = Plan(torch_version=scan.torch_version)
    for r in sorted(scan.by_verdict(MISSING) + scan.by_verdict(UNSUPPORTED), key=lambda r: r.name):
        entry = overlay.get(r.name)
        if entry is not None and entry.action == "skip":
            plan.left_out.append(LeftOut(r.name, r.file, r.line, f"skipped by the overlay: {entry.reason}"))
            continue
        if r.verdict == UNSUPPORTED:
            if strict:
                raise InputError(r.file, r.line, f"{r.name}: cannot generate a kernel: {r.reason}",
                                 "add a 'skip' entry with a reason to the overlay")
            plan.left_out.append(LeftOut(r.name, r.file, r.line, r.reason))
            continue
        plan.kernels.append(_kernel(r, entry, cpp[r.name]))
    plan.kernels.sort(key=lambda k: k.op)
    plan.left_out.sort(key=lambda lo: lo.op)
    return plan


def _kernel(r: OpRecord, entry, sig: CppSig) -> Kernel:
    xfail_devices = None
    xfail_reason = None
    if entry is not None and entry.action == "xfail":
        xfail_devices, xfail_reason = tuple(entry.devices), entry.reason
    return Kernel(
        op=r.name,
        name=r.name.split("::", 1)[1],
        fn=sig.unambiguous_name,
        schema=r.schema,
        yaml_name=os.path.basename(r.file),
        line=r.line,
        template=(entry.template if entry is not None and entry.template else DEFAULT_TEMPLATE),
        formals=sig.formals,
        call_args=sig.call_args,
        unambiguous_name=sig.unambiguous_name,
        root_name=sig.root_name,
        written=r.written,
        xfail_devices=xfail_devices,
        xfail_reason=xfail_reason,
    )
