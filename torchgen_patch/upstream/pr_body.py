"""The description of the pull request that carries the ``fix`` diff (``diff --pr-body FILE``).

The measured table comes from the version checks of ``verify``, run on this
machine's torch without and then with this tool's kernels (the same rule the
patched codegen emits, generated from the same schemas), so the description
states only what was measured here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..checks import verify as v
from ..checks.render import count_text
from ..errors import InputError
from ..vocabulary import Backend, Kind, Verdict
from .codegen_test import CODEGEN_TEST
from .patch import TARGET, TEST_FILE, VT_TARGET

ISSUE = "https://github.com/pytorch/pytorch/issues/132014"
EARLIER_PR = "https://github.com/pytorch/pytorch/pull/133044"
BOXED = "https://github.com/pytorch/pytorch/issues/64407"
SUBCLASS_FIX = "https://github.com/pytorch/pytorch/issues/191154"
# The calls bench/bench_callgrind.py measures, by name, and the fields the description reads of each.
CALLGRIND_CALLS = ("unpatched", "pytorch-shaped", "ours", "generated in-place")

# Calls shown one by one in the table, when the plan has them: the original report's op and
# one of each family.
SHOWN = ("aten::split_with_sizes_copy.out", "aten::_foreach_add.Scalar_out", "aten::_foreach_add_.Scalar",
         "aten::_foreach_zero_", "aten::_fused_adam_", "aten::_fused_sgd_",
         "aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_cummax_helper")

KIND_WORDS = {Kind.OUT: "out=", Kind.INPLACE: "in-place", Kind.MUTABLE: "mutable"}


@dataclass(frozen=True)
class Measurement:
    torch_version: str
    device: str
    before: list[v.OpResult]
    after: list[v.OpResult]
    refused: dict[str, str]
    grad_before: Sequence[v.GradResult] = ()  # the out= ops whose kernels refuse requires_grad, unpatched
    grad_after: Sequence[v.GradResult] = ()


def measure(plan, device: str) -> Measurement:
    """Every op of the plan checked without, then with, the kernels installed in this process
    (and the out= ops whose kernels refuse requires_grad, given inputs that require it)."""
    import torch

    from ..runtime.install import install

    ops = plan.ops()
    xfails = plan.xfails()
    refusing = [k.op for k in plan.kernels if k.refuse_name]
    before = v.run(ops, device, False, xfails)
    grad_before = v.run_grad(refusing, device, False)
    report = install(ops, backend=Backend.CPP, plan=plan)
    after = v.run(ops, device, True, xfails)
    grad_after = v.run_grad(refusing, device, True)
    return Measurement(torch.__version__, device, before, after, dict(report.refused), grad_before, grad_after)


def _cell(r: v.OpResult | None) -> str:
    if r is None:
        return ""
    bumps = " ".join(str(t.after - t.before) for t in r.tensors)
    return f"{bumps} ({r.verdict})" if bumps else r.verdict


def _table(m: Measurement) -> list[str]:
    before = {r.op: r for r in m.before}
    after = {r.op: r for r in m.after}
    lines = [f"Torch {m.torch_version}, `{m.device}`: how far each written tensor's version advanced in one call "
             "(it must be 1).", "",
             "| call | without the kernels | with the kernels |", "|---|---|---|"]
    for op in SHOWN:
        if op in before:
            lines.append(f"| `{op}` | {_cell(before[op])} | {_cell(after.get(op))} |")
    lines.append(f"| all {len(m.before)} operators | {count_text(m.before)} | {count_text(m.after)} |")
    lines += ["", "PASS: every written tensor advanced by exactly one; MISS: one did not advance; EXTRA: one "
              "advanced by more; NOT_RUN: the call needs what this machine lacks."]
    if m.refused:
        lines.append("Refused by the runtime install: "
                     + "; ".join(f"`{k}`: {r}" for k, r in sorted(m.refused.items())))
    if m.grad_before:
        lines += ["", f"The {len(m.grad_before)} `out=` operators that return nothing, called in grad mode with "
                  "every floating input requiring grad:", "",
                  "| without the kernels | with the kernels |", "|---|---|",
                  f"| {count_text(m.grad_before)} | {count_text(m.grad_after)} |", "",
                  "SILENT: the call went through and its outputs do not require grad; REFUSE: it raised "
                  "`<name>(): functions with out=... arguments don't support automatic differentiation, but one "
                  "of the arguments requires grad.` before writing anything."]
    return lines


def render(missing_kinds: dict[Kind, int], checkout_version: str, measurements: list[Measurement],
           unchecked: int = 0, instructions: dict | None = None) -> str:
    """The markdown body. ``missing_kinds``: kernels the patched codegen adds, by kind; ``unchecked``:
    out= operators whose VariableType kernels gain the requires-grad refusal; ``instructions``: the
    per-call instruction counts (bench/bench_callgrind.py's json)."""
    total = sum(missing_kinds.values())
    kinds = ", ".join(f"{n} {KIND_WORDS.get(k, k)}" for k, n in sorted(missing_kinds.items(), key=lambda kv: -kv[1]))
    out = _problem() + _change(total, checkout_version, kinds, unchecked) + [
        "## Measured before and after",
        "",
        "The same rule, generated from the same schemas, installed at run time into the released torch of this "
        "machine, stands in for the rebuilt torch:",
        "",
    ]
    for m in measurements:
        out += _table(m) + [""]
    out += _instructions(instructions) + _subclasses()
    return "\n".join(out + _testing(total, unchecked))


def instructions_ok(data) -> str:
    """'' when ``data`` is instruction counts the description can read, else what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("torch"), str):
        return "no `torch` version"
    if "not_run" in data:
        return "" if isinstance(data["not_run"], str) else "`not_run` is not a reason"
    calls = data.get("calls")
    if not isinstance(calls, list) or not isinstance(data.get("number"), int):
        return "no `calls` list or no `number`"
    names = [c.get("name") for c in calls if isinstance(c, dict) and isinstance(c.get("instructions"), int)]
    missing = [n for n in CALLGRIND_CALLS if n not in names]
    return f"no instruction count for {', '.join(missing)}" if missing else ""


def load_instructions(path: str) -> dict:
    """``--instructions``: the json, checked for what the description reads (InputError when it is not)."""
    import json

    from ..files import read_text

    try:
        data = json.loads(read_text(path, "the instruction counts"))
    except ValueError as e:
        raise InputError(path, None, f"not JSON: {e}") from None
    why = instructions_ok(data)
    if why:
        raise InputError(path, None, f"not instruction counts: {why}", "give what bench/bench_callgrind.py "
                         "--json writes")
    return data


def _instructions(data: dict | None) -> list[str]:
    """The per-call cost in instructions, in the form the boxed-kernel issue used."""
    out = ["## Per-call cost in instructions", ""]
    if data is None:
        return out + ["Not measured for this description (`diff --pr-body` without `--instructions`).", ""]
    if "not_run" in data:
        return out + [f"Not run: {data['not_run']}.", ""]
    c = {x["name"]: x["instructions"] for x in data["calls"]}
    before, after = c["unpatched"], c["pytorch-shaped"]
    return out + [
        f"Callgrind through `torch.utils.benchmark.Timer.collect_callgrind` (`denoise=True`), torch {data['torch']}, "
        f"CPU, one thread; instruction count per call, mean over {data['number']} calls in one valgrind run, as "
        f"in {BOXED}:", "",
        "`torch._foreach_add_(ts, 1.0)`, `ts` one tensor of one element (an operator that mutates and returns "
        "nothing)",
        f"Before (no kernel): {before:,}, After (the generated kernel): {after:,} "
        f"({after - before:+,}, {100 * (after - before) / before:+.1f}%)", "",
        f"`t.add_(1.0)` on the same tensor, whose `ADInplaceOrView` kernel PyTorch generates today: "
        f"{c['generated in-place']:,}", "",
        "The generated kernel is the one this change's codegen emits, cut out of its output and compiled on its own "
        "against the released torch; the same rule installed at run time by this tool costs "
        f"{c['ours']:,}.", ""]


def _subclasses() -> list[str]:
    """How the kernels compose with a bump after Python dispatch for tensor subclasses."""
    return [
        "## With a subclass fix that bumps after Python dispatch", "",
        f"A fix of {SUBCLASS_FIX}'s kind bumps the version counters of a tensor subclass's written arguments after "
        "`__torch_dispatch__` returns. `ADInplaceOrView` sits above the `Python` key: the kernel reads the "
        "wrapper's versions, redispatches (the subclass's `__torch_dispatch__` runs and calls the operator on its "
        "inner tensors, and the subclass fix bumps the wrapper), and bumps only the wrapper tensors whose version "
        "did not move. With both changes, "
        "every written wrapper advances exactly once per call (with either alone, too), and the tensors inside "
        "it exactly as under the in-place kernels PyTorch generates today (`add_` on the same wrapper): not at "
        "all, since the subclass's `__torch_dispatch__` runs below `ADInplaceOrView`; never twice. Tested for "
        "`DTensor` and for a plain wrapper subclass, with the subclass fix emulated by a `TorchDispatchMode` that "
        "bumps after dispatch.", ""]


def _problem() -> list[str]:
    """The title and the problem, as the issue and the earlier pull request left it."""
    return [
        "Generate ADInplaceOrView kernels (and requires-grad checks) for operators that mutate arguments and return "
        "nothing",
        "",
        f"Fixes {ISSUE}.",
        "",
        "## The problem",
        "",
        "Every in-place and `out=` operator bumps the version counter of each tensor it writes; autograd "
        "compares it with the version it saved and refuses to compute a gradient from a tensor that was "
        "overwritten. The bump lives in the `ADInplaceOrView` kernels that "
        f"`{TARGET}` generates, and that codegen skips every operator that mutates an argument and returns "
        "nothing: `out=` operators that write a `Tensor[]`, the `_foreach_*_` and `_fused_*_` operators, "
        "`_amp_foreach_non_finite_check_and_unscale_`, `_cummax_helper`/`_cummin_helper`. Whether they bump is "
        "left to each backend kernel: zero times on some (the fused optimizers everywhere, "
        "`split_with_sizes_copy.out` and `_foreach_zero_` on CUDA), twice on others (CUDA `_foreach_*.out`, "
        "whose kernel bumps and whose copy bumps again). With zero, `torch.optim.Adam(fused=True)` stepped "
        "between forward and backward silently yields the gradient of the updated parameter.",
        "",
        f"{EARLIER_PR} fixed it in the codegen and was closed without being merged; the codegen is unchanged "
        "since.",
        "",
        f"The same special case has an autograd half, in `{VT_TARGET}`: `requires_derivative` needs a "
        "differentiable output, so an `out=` operator that returns nothing gets a `VariableType` kernel that "
        "only redispatches (the codegen's own comment: \"out= ops for autograd just redispatch\"). Where "
        "`add.out` raises \"add(): functions with out=... arguments don't support automatic differentiation, "
        "but one of the arguments requires grad.\", `torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])` "
        "with `x` requiring grad succeeds, and `y`, `z` do not require grad: gradients through them are lost "
        "without a word.",
        "",
    ]


def _change(total: int, checkout_version: str, kinds: str, unchecked: int) -> list[str]:
    """What the change does, and why exactly one bump."""
    return [
        "## What this change does",
        "",
        f"`{TARGET}` emits and registers an `ADInplaceOrView` kernel for every operator that mutates an "
        f"argument and returns nothing and is not a view ({total} operators in this checkout, PyTorch "
        f"{checkout_version}: {kinds}). The kernels go into the existing template and shards "
        "(`ADInplaceOrViewType_{0,1}.cpp`): no new generated file, no build-file edit; every other generated "
        "file but the `VariableType_*.cpp` stays byte-identical.",
        "",
        f"`{VT_TARGET}` gives the `VariableType` kernel of every `out=` operator that returns nothing and has a "
        f"differentiable input ({unchecked} operators in this checkout) the checks `out=` operators that return "
        "something already have: `throw_error_out_requires_grad` when an input, or an output, requires grad in "
        "grad mode, before the call. Nothing changes under `no_grad` or `inference_mode` (FSDP2 calls "
        "`split_with_sizes_copy.out` under `no_grad`). The in-place operators that return nothing and skip "
        "`check_inplace` (`_fused_*_`, `_amp_foreach_non_finite_check_and_unscale_`) are left as they are.",
        "",
        f"It also adds `{TEST_FILE}`, and cases to `{CODEGEN_TEST}`.",
        "",
        "## Exactly one bump per call",
        "",
        "Each kernel reads the version of every written tensor (each tensor of a written `Tensor[]`) before it "
        "redispatches below `ADInplaceOrView`, and afterwards bumps only the "
        "tensors whose version did not move. An unconditional bump, as the kernels of operators that return "
        "their output do, would be wrong here: the CUDA `_foreach_*` kernels already call `increment_version` "
        "on what they write, and would end two versions ahead. Trusting the backend is what fails today. So "
        "every written tensor ends exactly one version higher per call, whatever the backend does; undefined "
        "tensors are skipped.",
        "",
    ]


def _testing(total: int, unchecked: int) -> list[str]:
    """How it was tested."""
    return [
        "## How it was tested",
        "",
        f"- `{TEST_FILE}` (new; `common_utils.TestCase`, device-generic through `instantiate_device_type_tests`, "
        "OpInfo samples where an OpInfo exists):",
        "  - every `aten` operator of the live registry that mutates an argument, returns nothing and is not "
        "`CompositeImplicitAutograd` has an `ADInplaceOrView` kernel (computed from the registry's schemas, so "
        "it covers operators added later);",
        "  - per device, each written tensor advances exactly once for `split_with_sizes_copy.out`, "
        "`_foreach_add`/`_foreach_sqrt` (`.out` and in-place), `_foreach_zero_`, the fused Adam/AdamW/SGD/Adagrad "
        "operators, `_amp_foreach_non_finite_check_and_unscale_` and `_cummax_helper`;",
        "  - a fused-optimizer step between forward and backward makes backward raise;",
        "  - `split_with_sizes_copy.out`, `unbind_copy.int_out`, `unsafe_split.Tensor_out`, `_foreach_add.Scalar_out` "
        "and `_foreach_exp.out` refuse an input (or an output) that requires grad, and write nothing; under "
        "`no_grad` they work as before.",
        "- The test fails on the released torch (listing the operators without a kernel) and passes with the "
        "kernels installed: the checks of this tool's own CI on CPU, and on CUDA where a GPU was at hand.",
        f"- `{CODEGEN_TEST}` (`TestGenInplaceOrViewType`, new): a `NativeFunction` built from the schema of a "
        "zero-returns `out=` operator (`split_with_sizes_copy.out`, `Tensor(a!)[] out) -> ()`), of "
        "`_foreach_add_.List` and of `_fused_adam_`; each gets a definition and a registration, reads the version "
        "of every written argument before the redispatch and bumps it after, and touches no argument it only "
        "reads; a functional operator still gets none. The cases fail on the codegen before this change and pass "
        "with it (`pytest tools/test/test_codegen.py`, on PyTorch's source tree of a release and on the codegen "
        "of the newest one).",
        "- The patched codegen's output differs from the unpatched one only in `ADInplaceOrViewType_*.cpp`, which "
        f"gain exactly the {total} kernels, and in `VariableType_*.cpp`, whose kernels of exactly the {unchecked} "
        "`out=` operators gain the two checks (nothing else in them changes).",
        f"- `ruff check`, `ruff format --check` and `mypy` on `{TARGET}`, `{VT_TARGET}`, `{CODEGEN_TEST}` (no new "
        f"finding) and `{TEST_FILE}`.",
        "",
    ]


def missing_by_kind(scan) -> dict[Kind, int]:
    return dict(Counter(r.kind for r in scan.by_verdict(Verdict.MISSING)))


def measured(root: str, instructions_path: str | None = None) -> str:
    """``diff --pr-body``: the description for the checkout at ``root``, measured on this machine's torch
    (CPU, and CUDA where there is one); the instruction counts read from ``instructions_path``."""
    from .. import pipeline
    from ..errors import require_torch
    from ..sources import Options
    from ..vocabulary import Gap

    instructions = load_instructions(instructions_path) if instructions_path else None
    checkout = pipeline.inputs(Options(pytorch_root=root, no_overlay=True))
    _, plan = pipeline.plan(Options())
    devices = ["cpu"] + (["cuda"] if require_torch("--pr-body").cuda.is_available() else [])
    return render(missing_by_kind(checkout.scan), checkout.sources.torch_version,
                  [measure(plan, d) for d in devices], len(checkout.scan.with_gap(Gap.OUT)), instructions)
