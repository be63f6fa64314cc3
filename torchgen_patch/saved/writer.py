"""Whether an optimizer that stepped between save and use holds a saved tensor, so that a finding
can name it as the writer (``attribute.Steps.since``): run only when a finding is made.

An optimizer holds a saved tensor when the tensor is, is a view of, or lies in the storage of:

- one of the optimizer's parameters (what a step writes, through the dispatcher or not: fused kernels,
  a library's C++ optimizer writing through ``p.data``);
- the local shard of a parameter that is a DTensor (what the step writes of it);
- the unsharded copy FSDP2 all-gathers from a parameter it holds (``FSDPParam``'s unsharded parameter
  and all-gather outputs): with ``reshard_after_forward=True`` that copy is freed after forward and
  gathered again from the shards before backward, so a step in between reaches the saved tensor through
  the gather. The copies are found from the FSDP2 parameters alive in the process whose sharded
  parameter the optimizer holds, so nothing is recorded at the step and nothing when FSDP2 is not used.

Storage is compared by its identity (a tensor whose storage was freed and gathered again keeps the same
storage object) and by address (a view, a tensor that is only facts kept at the end of backward)."""

from __future__ import annotations

import gc
import sys

# where FSDP2 keeps its FSDPParam, by torch release (the public package first)
_FSDP_PARAM = ("torch.distributed.fsdp._fully_shard._fsdp_param", "torch.distributed._composable.fsdp._fsdp_param")


def holds(optimizer, t, original=None) -> bool:
    """Whether ``optimizer``'s parameters hold ``t`` (the saved tensor now, or the facts kept of it;
    ``original``: the tensor that was saved, if alive), as the module's docstring says."""
    params = [p for g in getattr(optimizer, "param_groups", ()) for p in g["params"]]
    if not params:
        return False
    near = [x for x in (t, original) if x is not None]
    bases = {id(b) for b in (getattr(x, "_base", None) for x in near) if b is not None}
    storages = {s for s in (_storage(x) for x in near) if s}
    for c in _candidates(params):
        if any(c is x for x in near) or id(c) in bases or (storages and _storage(c) in storages) or inside(t, c):
            return True
    return False


def _candidates(params: list):
    """The optimizer's parameters, their DTensor shards and FSDP2's unsharded copies of them."""
    yield from params
    for p in params:
        local = getattr(p, "_local_tensor", None)
        if local is not None:
            yield local
    yield from _fsdp_copies(params)


def _fsdp_copies(params: list) -> list:
    """FSDP2's unsharded copies (and all-gather outputs) of the parameters ``params`` holds as shards."""
    classes = tuple(c for c in (getattr(sys.modules.get(m), "FSDPParam", None) for m in _FSDP_PARAM) if c)
    if not classes:
        return []
    ids = {id(p) for p in params}
    out = []
    for o in gc.get_objects():
        if isinstance(o, classes) and id(getattr(o, "sharded_param", None)) in ids:
            out += [c for c in (getattr(o, "_unsharded_param", None), *(getattr(o, "all_gather_outputs", None) or ()))
                    if c is not None]
    return out


def _storage(t) -> int | None:
    """The identity of ``t``'s storage (the same while it is freed and allocated again; of facts kept at
    the end of backward, as kept at use), or None."""
    kept = getattr(t, "storage_id", None)  # facts kept without the tensor (hooks._Facts)
    if kept is not None:
        return kept
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 — facts kept without the tensor, a wrapper subclass without storage
        return None


def inside(t, p) -> bool:
    """``t``'s memory lies inside ``p``'s (a view of it, a transposed weight)."""
    try:
        if p.device != t.device or p.numel() == 0 or t.numel() == 0:
            return False
        lo, plo = t.data_ptr(), p.data_ptr()
        return plo <= lo < plo + p.numel() * p.element_size()
    except Exception:  # noqa: BLE001 — no storage to compare (a wrapper subclass)
        return False
