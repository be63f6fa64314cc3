"""A minimal upstream issue about the fused optimizers (``diff --issue FILE``), measured on this machine's
torch: the repro (a fused Adam, AdamW or SGD stepped between forward and backward gives the gradient of
the stepped parameters without an error; the foreach implementation raises), run here with its output;
the version of every tensor each fused op writes, before and after one call, per device; and the
related reports, by number.

Each figure is measured when the text is written; a device this machine lacks is said to be not run.
"""

from __future__ import annotations

import contextlib
import io

from ..checks import verify as v

REPORT = "https://github.com/pytorch/pytorch/issues/132014"
RELATED = (
    ("pytorch/pytorch#132014", "the codegen gives no ADInplaceOrView kernel to operators that mutate arguments "
                               "and return nothing"),
    ("pytorch/pytorch#133044", "the codegen fix, closed without being merged"),
    ("pytorch/pytorch#64407", "a boxed ADInplaceOrView kernel, judged by its cost in instructions"),
    ("pytorch/pytorch#139513, pytorch/pytorch#186175", "version-counter bumps for custom operators that mutate "
                                                       "their inputs"),
    ("pytorch/pytorch#191154", "a version bump after Python dispatch for foreach operators on tensor subclasses"),
)
FUSED = ("aten::_fused_adam_", "aten::_fused_adamw_", "aten::_fused_sgd_", "aten::_fused_adagrad_")
FOREACH = ("aten::_foreach_add_.Scalar", "aten::_foreach_mul_.Scalar")

# The repro: runnable as it stands, with torch alone; DEVICE is the one line set per device.
REPRO = '''import torch

DEVICE = "cpu"
optimizers = {
    "Adam(fused=True)": lambda p: torch.optim.Adam(p, lr=0.1, fused=True),
    "AdamW(fused=True)": lambda p: torch.optim.AdamW(p, lr=0.1, fused=True),
    "SGD(fused=True)": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
    "Adam(foreach=True)": lambda p: torch.optim.Adam(p, lr=0.1, foreach=True),
}
for name, make in optimizers.items():
    w = torch.ones(3, device=DEVICE, requires_grad=True)
    x = torch.arange(3.0, device=DEVICE)
    loss = (w * w * x).sum()  # saves w for backward: d loss / d w = 2 * w * x
    w.grad = torch.ones_like(w)
    opt = make([w])
    before = w._version
    opt.step()  # between forward and backward: w changes in place
    stepped, w.grad = w.detach().clone(), None
    try:
        loss.backward()
    except RuntimeError as e:
        print(f"{name}: version +{w._version - before}, backward raised: {str(e)[:60]}...")
        continue
    of_stepped = torch.equal(w.grad, 2 * stepped * x)
    print(f"{name}: version +{w._version - before}, no error, "
          f"gradient of the stepped parameter: {of_stepped}")
'''


def repro(device: str) -> str:
    return REPRO.replace('DEVICE = "cpu"', f'DEVICE = "{device}"')


def run_repro(device: str) -> str:
    """The repro's output, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(repro(device), "<repro>", "exec"), {"__name__": "__repro__"})  # noqa: S102 — our own text
    return out.getvalue()


def _cell(r: v.OpResult) -> str:
    """Each written argument's tensors, before → after (one figure for a list whose tensors agree)."""
    if r.verdict == v.NOT_RUN or not r.tensors:
        return f"not run ({r.message})" if r.message else str(r.verdict)
    by_arg: dict[str, list[tuple[int, int]]] = {}
    for t in r.tensors:
        by_arg.setdefault(t.arg.split("[", 1)[0], []).append((t.before, t.after))
    cells = []
    for arg, seen in by_arg.items():
        if len(set(seen)) == 1:
            n = f" ({len(seen)} tensors)" if len(seen) > 1 else ""
            cells.append(f"`{arg}` {seen[0][0]} → {seen[0][1]}{n}")
        else:
            cells.append(f"`{arg}` " + ", ".join(f"{b} → {a}" for b, a in seen))
    return "; ".join(cells)


def _versions(devices: dict[str, bool]) -> list[str]:
    """Per op and device: each written tensor's version before and after one call, unpatched."""
    ops = list(FUSED + FOREACH)
    cols = {d: ({r.op: r for r in v.run(ops, d, False)} if ran else None) for d, ran in devices.items()}
    lines = ["| operator | " + " | ".join(f"`{d}`: version before → after one call" for d in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for op in ops:
        lines.append(f"| `{op}` | " + " | ".join(_cell(c[op]) if c else "not run here (no such device)"
                                                for c in cols.values()) + " |")
    return lines


def _by_hand(devices: dict[str, bool]) -> list[str]:
    """Which backends' kernels bump the version themselves: measured as the ops whose every written
    tensor advanced with no ADInplaceOrView kernel registered (none is, unpatched)."""
    out = []
    for d, ran in devices.items():
        if not ran:
            out.append(f"- `{d}`: not run here (no such device).")
            continue
        res = v.run(list(FUSED + FOREACH), d, False)
        bumped = [r.op for r in res if r.tensors and all(t.after > t.before for t in r.tensors)]
        missed = [r.op for r in res if r.tensors and any(t.after == t.before for t in r.tensors)]
        out.append(f"- `{d}`: the backend kernel bumps every written tensor (itself, or through the in-place "
                   f"operators it calls): {', '.join(f'`{o}`' for o in bumped) or 'none'}; it bumps none or not all: "
                   f"{', '.join(f'`{o}`' for o in missed) or 'none'}.")
    return out


def render(torch_version: str, devices: dict[str, bool]) -> str:
    """The issue's markdown; ``devices``: device -> whether this machine has it (run) or not."""
    out = ["Fused optimizers stepped between forward and backward give a wrong gradient, without an error", "",
           "## Repro", "", "```python", REPRO.rstrip("\n"), "```", ""]
    for d, ran in devices.items():
        if ran:
            out += [f"Output, torch {torch_version}, `{d}`:", "", "```", run_repro(d).rstrip("\n"), "```", ""]
        else:
            out += [f"Output on `{d}`: not run here (no such device on this machine).", ""]
    out += ["The foreach implementation bumps the parameter's version counter, so backward refuses the "
            "overwritten tensor. The fused kernels write the same tensors and bump nothing: autograd cannot tell "
            "the saved tensor changed, and backward computes the gradient of the stepped parameter.", "",
            "## Versions of what each operator writes", "",
            f"torch {torch_version}, each operator called once on small inputs, no ADInplaceOrView kernel "
            "registered for any of them (the codegen gives none to operators that mutate arguments and return "
            "nothing):", ""]
    out += _versions(devices) + ["", "## Which backends bump by hand", ""] + _by_hand(devices)
    out += ["", "## Related", ""] + [f"- {n}: {what}" for n, what in RELATED] + [""]
    return "\n".join(out)


def measured() -> str:
    """The issue measured with this machine's torch: CPU, and CUDA where there is one."""
    from ..errors import require_torch

    torch = require_torch("--issue")
    return render(torch.__version__, {"cpu": True, "cuda": torch.cuda.is_available()})
