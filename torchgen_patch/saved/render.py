"""The saved-tensor check's renderers, one per place a finding shows: the stderr line (``warn``),
the exception's message (``raise``), JSON (``Check.to_json()``), and the count at exit."""

from __future__ import annotations

import json

from ..errors import printable
from ..vocabulary import Writer, plural
from .finding import Finding, Frame

PREFIX = "torchgen-patch: saved tensor changed without a version bump"

_WRITER = {
    Writer.OPTIMIZER: "the optimizer {optimizer}, whose step{at} ran between save and use (a step that writes outside "
                      "the dispatcher moves no version)",
    Writer.TRITON: "the Triton kernel `{kernel}` launched at {launch}, between save and use, with a pointer into its "
                   "storage",
    Writer.STORAGE: "`.data = ...` or `set_data()`, which gave it other storage",
    Writer.DATA: "an in-place op on `.data` (`p.data.mul_(2)`: `.data` has a version counter of its own)",
    Writer.ALIAS: "a numpy, DLPack or buffer alias of its memory (`.numpy()`, `torch.from_dlpack`, `np.frombuffer`, "
                  "shared memory)",
    Writer.KERNEL: "a C++ or Triton kernel of a library writing through `data_ptr()`",
    Writer.HOOKS: "the program's own saved-tensor hooks gave back other contents than were saved (a recomputation "
                  "from inputs written since, or a kernel that does not compute the same bits twice)",
}


# what to change, by the most likely writer: {tensor} is how a person names it, {backward} the backward call's frame,
# {step} the optimizer's step to move (with the line of its step() call, where known)
_FIX = {
    Writer.OPTIMIZER: "{step} after the backward call at {backward}, not between the forward that saved {tensor} "
                      "and that backward (gradient accumulation: step once every micro-batch's backward ran)",
    Writer.TRITON: "after the kernel `{kernel}` launched at {launch}, call `torch.autograd.graph.increment_version(t)` "
                   "on the tensor it wrote, {tensor} (in a custom Function's forward: `ctx.mark_dirty(t)`); or have "
                   "the kernel write a copy, or launch it after the backward call at {backward}",
    Writer.STORAGE: "do not give {tensor} other storage between forward and backward: copy into it in place under "
                    "`torch.no_grad()` (`t.copy_(new)`), or do it after the backward call at {backward}",
    Writer.DATA: "write {tensor} itself in place under `torch.no_grad()` (`with torch.no_grad(): t.mul_(2)`), not "
                 "through `.data`, so autograd sees its version move; or write it after the backward call at "
                 "{backward}",
    Writer.ALIAS: "after writing {tensor} through an alias, call `torch.autograd.graph.increment_version(t)`; or write "
                  "it after the backward call at {backward}",
    Writer.KERNEL: "after a library's kernel writes {tensor}, call `torch.autograd.graph.increment_version(t)` (in a "
                   "custom Function's forward: `ctx.mark_dirty(t)`); or have the kernel write a copy",
    Writer.HOOKS: "have the program's saved-tensor hooks give back what was saved for {tensor}: recompute only from "
                  "inputs not written since, or keep a copy",
}


def tensor(f: Finding) -> str:
    """The tensor, as a person names it: its module path when it is a parameter or buffer."""
    shape = f"{f.dtype}[{', '.join(map(str, f.shape))}] on {f.device}"
    if f.name is None:
        return f"a tensor {shape}"
    return f"{'a view of ' if f.view else ''}`{printable(f.name)}` of {printable(f.owner or 'a module')} ({shape})"


def _frame(frame: Frame | None) -> str:
    return printable(frame.render()) if frame else "an unknown frame"


def _at(f: Finding) -> str:
    """Where the optimizer's step was called, where the finding knows it."""
    return f" at {_frame(f.step)}" if f.step else ""


def _step(f: Finding) -> str:
    """What the fix of an optimizer's step says to do, with the line of its step() call where known."""
    optimizer = f.optimizer or "the optimizer"
    return f"move the step of {optimizer}{_at(f)}" if f.step else f"step {optimizer}"


def _kernel(f: Finding) -> str:
    return printable(f.kernel or "an unnamed kernel").replace("`", "'")


def writers(f: Finding) -> str:
    return "; ".join(_WRITER[w].format(optimizer=f.optimizer, at=_at(f), kernel=_kernel(f), launch=_frame(f.launch))
                     for w in f.writers)


def fix(f: Finding) -> str:
    """What to change, for the most likely writer (empty where none is named)."""
    if not f.writers:
        return ""
    return _FIX[f.writers[0]].format(optimizer=f.optimizer or "the optimizer", backward=_frame(f.backward),
                                     tensor=tensor(f), step=_step(f), kernel=_kernel(f), launch=_frame(f.launch))


def line(f: Finding) -> str:
    """``warn``: one line on stderr per distinct finding."""
    saved = f"saved by {f.node or 'an unknown node'} in the forward call at {_frame(f.forward)}" + (
        f", called from {_frame(f.call)}" if f.call else "")
    rank = f" [rank {f.rank}]" if f.rank is not None else ""
    return (f"{PREFIX}{rank}: {tensor(f)}, {saved}, used by the backward call at {_frame(f.backward)}; "
            f"likely written by: {writers(f)}" + (f"; fix: {fix(f)}" if f.writers else ""))


def message(f: Finding) -> str:
    """``raise``: the exception's message (several lines)."""
    lines = [f"a tensor saved for backward was written while its version stayed {f.version}: autograd cannot see "
             "the write, so backward would compute with the new contents",
             f"  tensor:   {tensor(f)}",
             f"  saved by: {f.node or 'an unknown node'}, in the forward call at {_frame(f.forward)}"]
    if f.site:
        lines.append(f"            (inside {_frame(f.site)})")
    if f.call:
        lines.append(f"            (called from {_frame(f.call)})")
    lines.append(f"  used by:  the backward call at {_frame(f.backward)}")
    lines.append("  likely written by: " + writers(f))
    if f.writers:
        lines.append("  fix:      " + fix(f))
    if f.rank is not None:
        lines.append(f"  rank:     {f.rank}")
    return "\n".join(lines)


def as_dict(f: Finding) -> dict:
    def frame(fr):
        return None if fr is None else {"file": fr.file, "line": fr.line, "function": fr.function}

    return {"tensor": {"name": f.name, "owner": f.owner, "view": f.view, "shape": list(f.shape), "dtype": f.dtype,
                       "device": f.device, "version": f.version},
            "node": f.node, "forward": frame(f.forward), "site": frame(f.site), "call": frame(f.call),
            "backward": frame(f.backward), "writers": [str(w) for w in f.writers], "optimizer": f.optimizer,
            "optimizer_step": frame(f.step), "triton_kernel": kernel(f), "rank": f.rank, "fix": fix(f) or None}


def kernel(f: Finding) -> dict | None:
    """The Triton kernel a finding names, for programs: its name and the frame that launched it (each null
    where unknown), or None."""
    if f.kernel is None:
        return None
    where = f.launch
    return {"name": f.kernel, "file": where.file if where else None, "line": where.line if where else None,
            "function": where.function if where else None}


def to_json(findings: list[Finding]) -> str:
    """Every finding, in the order found, as a JSON array."""
    return json.dumps([as_dict(f) for f in findings], indent=2, sort_keys=True) + "\n"


def summary(found: int, distinct: int, checked: int, skipped: dict[str, int], where: str,
            sampled: tuple[int, int, int] | None = None) -> str:
    """``warn``: the count at exit; ``sampled``: (draws that drew, draws, N) of a check sampled at N."""
    text = (f"torchgen-patch: saved-tensor check{where}: {plural(found, 'changed saved tensor')}"
            f" ({distinct} distinct) in {checked} checked")
    if sampled is not None:
        text += f" (sampled at 1/{sampled[2]}: {sampled[0]} of {plural(sampled[1], 'draw')} hit)"
    if skipped:
        text += "; contents not read for " + ", ".join(f"{n} ({why})" for why, n in sorted(skipped.items()))
    return text
