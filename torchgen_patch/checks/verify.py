"""Verify: run each op of the plan on its sample and check that every tensor
it writes ends exactly one version higher.

Verdicts: PASS (+1 each), MISS (some tensor not bumped), EXTRA (some tensor
bumped more than once), ERROR (the call raised), NOT_RUN (no sample on this
device, with the reason), and XFAIL/XPASS for ops the overlay expects to fail.
The results are data; ``render.py`` writes every report of them (and the
verdicts' legend for people).

The requires-grad check (``run_grad``): run an out= op of the plan on its sample with every floating
input (not the tensors it writes) requiring grad, in grad mode, and see whether it refuses: REFUSE
(PyTorch's out= message, nothing written), SILENT (the call went through: gradients through its outputs
are lost), ERROR (another failure), NOT_RUN (no sample here, or no floating input).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..runtime.pykernel import OUT_REQUIRES_GRAD
from ..vocabulary import Outcome

PASS, MISS, EXTRA, ERROR, NOT_RUN, XFAIL, XPASS = (Outcome.PASS, Outcome.MISS, Outcome.EXTRA, Outcome.ERROR,
                                                   Outcome.NOT_RUN, Outcome.XFAIL, Outcome.XPASS)
FAILING = {MISS, EXTRA, ERROR}


@dataclass
class TensorResult:
    arg: str
    before: int
    after: int


@dataclass
class OpResult:
    op: str
    device: str
    patched: bool
    verdict: Outcome
    tensors: list[TensorResult] = field(default_factory=list)
    message: str = ""
    subclass: str = "plain"  # the tensor subclass every tensor argument was wrapped in


def run_op(op: str, device: str, patched: bool, xfail: tuple[str, ...] | None = None, call=None,
           subclass: str = "plain", mesh=None) -> OpResult:
    """Run ``op`` once on its sample (every tensor wrapped in ``subclass`` unless plain;
    ``mesh``: the DeviceMesh of ``dtensor``). ``call`` replaces the op (tests of verify itself)."""
    from .samples import NoSample, opoverload, sample
    from .subclass import cannot_run, placements, wrap

    reason = ""
    for placement in placements(subclass):
        try:
            s = sample(op, device)
            call = call or opoverload(op)
            if subclass != "plain":
                s = wrap(s, subclass, mesh, placement)
        except NoSample as e:
            return OpResult(op, device, patched, NOT_RUN, message=str(e), subclass=subclass)
        except Exception as e:  # noqa: BLE001 — a recipe that does not fit this torch: a failure, never a pass
            return OpResult(op, device, patched, ERROR, message=f"building the sample: {type(e).__name__}: {e}",
                            subclass=subclass)
        written = s.written_tensors()
        before = [int(t._version) for _, t in written]
        try:
            call(*s.args, **s.kwargs)
        except Exception as e:  # noqa: BLE001 — the op's own failure is a result, not a crash of verify
            reason = (subclass != "plain" and cannot_run(op, device, subclass, mesh, placement, call)) or ""
            if reason:
                continue  # the subclass's own limit: the next placement, or NOT_RUN
            return OpResult(op, device, patched, ERROR, message=f"{type(e).__name__}: {str(e).splitlines()[0]}",
                            subclass=subclass)
        res = [TensorResult(n, b, int(t._version)) for (n, t), b in zip(written, before, strict=True)]
        deltas = [r.after - r.before for r in res]
        verdict = PASS
        if any(d > 1 for d in deltas):
            verdict = EXTRA
        elif any(d < 1 for d in deltas):
            verdict = MISS
        if xfail is not None and (not xfail or device in xfail):
            verdict = XPASS if verdict == PASS else XFAIL
        return OpResult(op, device, patched, verdict, res, message=placement and f"placements {placement}",
                        subclass=subclass)
    return OpResult(op, device, patched, NOT_RUN, message=reason, subclass=subclass)


def run(ops: list[str], device: str, patched: bool, xfails: dict | None = None, subclass: str = "plain",
        progress=None) -> list[OpResult]:
    """Every op of ``ops`` once, sorted, every tensor wrapped in ``subclass`` unless plain;
    ``progress(done, total, result)`` after each."""
    xfails = xfails or {}

    def each(mesh=None) -> list[OpResult]:
        out = []
        for op in sorted(ops):
            out.append(run_op(op, device, patched, xfails.get(op), subclass=subclass, mesh=mesh))
            if progress is not None:
                progress(len(out), len(ops), out[-1])
        return out

    if subclass != "dtensor":
        return each()
    from .subclass import Unavailable, one_rank_mesh

    try:
        with one_rank_mesh(device) as mesh:
            return each(mesh)
    except Unavailable as e:
        return [OpResult(op, device, patched, NOT_RUN, message=str(e), subclass=subclass) for op in sorted(ops)]


def counts(results: Sequence[OpResult] | Sequence[GradResult]) -> dict[Outcome, int]:
    """How many results of each verdict, by verdict."""
    c: dict[Outcome, int] = {}
    for r in results:
        c[r.verdict] = c.get(r.verdict, 0) + 1
    return dict(sorted(c.items()))


# ---------------------------------------------------------------------------
# The requires-grad check

REFUSE, SILENT = Outcome.REFUSE, Outcome.SILENT  # and ERROR, NOT_RUN as above
MESSAGE = OUT_REQUIRES_GRAD  # PyTorch's own, after the op's name


@dataclass
class GradResult:
    op: str
    device: str
    patched: bool
    verdict: Outcome
    message: str = ""
    unwritten: bool | None = None  # REFUSE: the written tensors are unchanged (None: not refused)


def _requiring_grad(value, written: set[int]):
    """``value`` with each floating tensor that is not written replaced by a leaf that requires grad."""
    if isinstance(value, (list, tuple)):
        return type(value)(_requiring_grad(v, written) for v in value)
    if hasattr(value, "requires_grad_") and id(value) not in written and value.is_floating_point():
        return value.detach().clone().requires_grad_(True)
    return value


def _same_bits(before, after) -> bool:
    import torch

    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    if before.is_quantized:  # their bytes are not viewable: the integer representation is what is written
        before, after = before.int_repr(), after.detach().int_repr()
    return torch.equal(before.contiguous().reshape(-1).view(torch.uint8),
                       after.detach().contiguous().reshape(-1).view(torch.uint8))


def run_grad_op(op: str, device: str, patched: bool, outputs: bool = False) -> GradResult:
    """``op`` once, in grad mode, with its floating inputs requiring grad (``outputs``: its written
    tensors instead, as leaves that require grad)."""
    import torch

    from .samples import NoSample, opoverload, sample

    try:
        s = sample(op, device)
    except NoSample as e:
        return GradResult(op, device, patched, NOT_RUN, str(e))
    except Exception as e:  # noqa: BLE001 — a recipe that does not fit this torch: never a pass
        return GradResult(op, device, patched, ERROR, f"building the sample: {type(e).__name__}: {e}")
    written = {id(t) for _, t in s.written_tensors()}
    if outputs:
        for _, t in s.written_tensors():
            if t.is_floating_point():
                t.requires_grad_(True)
        args, kwargs = s.args, s.kwargs
        asked = any(t.requires_grad for _, t in s.written_tensors())
    else:
        args = [_requiring_grad(a, written) for a in s.args]
        kwargs = {k: _requiring_grad(v, written) for k, v in s.kwargs.items()}
        asked = any(getattr(t, "requires_grad", False) for v in [*args, *kwargs.values()]
                    for t in (v if isinstance(v, (list, tuple)) else [v]))
    if not asked:
        return GradResult(op, device, patched, NOT_RUN, "no floating tensor to require grad")
    before = [t.detach().clone() for _, t in s.written_tensors()]
    try:
        with torch.enable_grad():
            opoverload(op)(*args, **kwargs)
    except RuntimeError as e:
        text = str(e).splitlines()[0] if str(e) else ""
        if text.endswith(MESSAGE):
            same = all(_same_bits(b, t) for b, (_, t) in zip(before, s.written_tensors(), strict=True))
            return GradResult(op, device, patched, REFUSE, text, same)
        return GradResult(op, device, patched, ERROR, f"RuntimeError: {text}")
    except Exception as e:  # noqa: BLE001 — the op's own failure is a result
        return GradResult(op, device, patched, ERROR, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return GradResult(op, device, patched, SILENT)


def run_grad(ops: list[str], device: str, patched: bool, outputs: bool = False) -> list[GradResult]:
    return [run_grad_op(op, device, patched, outputs) for op in sorted(ops)]
