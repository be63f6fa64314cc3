"""Where this torch keeps FSDP2, for the tests and the two-rank script that shard with it."""

from __future__ import annotations


def fsdp2() -> tuple[str, list[str]]:
    """FSDP2's module (`fully_shard`: torch.distributed.fsdp, or torch.distributed._composable.fsdp in
    releases that lack it there) and the ``fsdp::`` ops that importing it defines (none in torch 2.4,
    whose FSDP2 calls aten's ops directly)."""
    import importlib

    import torch
    import torch.distributed.fsdp as public

    name = public.__name__ if hasattr(public, "fully_shard") else "torch.distributed._composable.fsdp"
    importlib.import_module(name)
    ops = [f"fsdp::{n}" for n in ("split_with_sizes_copy", "chunk_cat", "copy_")
           if hasattr(torch.ops.fsdp, n.split(".")[0])]
    return name, ops
