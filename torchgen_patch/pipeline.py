"""The pipeline, one path for every command and the Python API:

    Options → sources → scan → overlay → plan → files (→ build → install → verify)

Each stage is a function of the previous stage's value; nothing is parsed
twice and nothing here reads command-line arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codegen import render, template_names
from .codegen.render import MAX_SHARDS
from .errors import InputError
from .plan import Plan, make_plan
from .plan import overlay as ov
from .scan import Scan, scan
from .sources import Options, Sources, resolve

__all__ = ["Inputs", "Options", "inputs", "plan", "generate"]


@dataclass(frozen=True)
class Inputs:
    sources: Sources
    scan: Scan
    overlay: ov.Overlay


def inputs(opts: Options, autograd: bool = True) -> Inputs:
    """``autograd`` False: a scan without the VariableType kernels' gaps (enough for a plain lint)."""
    src = resolve(opts)
    sc = scan(src, use_cache=not opts.no_cache, autograd=autograd)
    return Inputs(src, sc, ov.load(src, sc, template_names()))


def plan(opts: Options, strict: bool = False) -> tuple[Inputs, Plan]:
    i = inputs(opts)
    return i, make_plan(i.scan, i.overlay, strict=strict, requires_grad_check=opts.requires_grad_check)


def generate(opts: Options, shards: int = 2, strict: bool = False) -> tuple[Inputs, Plan, dict[str, bytes]]:
    """Sources → scan → overlay → plan → the generated files (name → bytes)."""
    check_shards(shards)
    i, p = plan(opts, strict)
    return i, p, render(p, shards)


def check_shards(n: int) -> None:
    if not 1 <= n <= MAX_SHARDS:
        raise InputError(None, None, f"--shards must be between 1 and {MAX_SHARDS}, not {n}",
                         "PyTorch's own codegen uses 5 shards for ~1,100 kernels")
