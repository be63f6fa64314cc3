"""Extension libraries as the tests and the ecosystem audit drive them: bitsandbytes' optimizers, which
write parameters through ops that have no ADInplaceOrView kernel, and fbgemm's CPU table-batched
embedding with a fused optimizer, whose backward writes the table in place. Each library is imported
when a helper is called, never by importing this module."""

from __future__ import annotations

import warnings

# bitsandbytes' own CPU backend fails these (0.50.2: "output with shape [64] doesn't match the
# broadcast shape [64, 64]" in its 32-bit AdEMAMix kernel); the tests assert it, so the list stays true
CPU_BROKEN = {"AdEMAMix32bit", "PagedAdEMAMix32bit"}
# PytorchLARS is written with aten ops, which bump: the control
CONTROL = "PytorchLARS"
FUSED = ["EXACT_SGD", "EXACT_ROWWISE_ADAGRAD"]  # fbgemm's fused optimizers that run on CPU


def bnb_optimizers() -> list[str]:
    """Every optimizer class bitsandbytes exports (40 in 0.50.2; all run on CPU), less the control and
    those its CPU backend cannot step, sorted."""
    import bitsandbytes as bnb
    import torch

    return sorted(n for n in dir(bnb.optim) if isinstance(getattr(bnb.optim, n), type)
                  and issubclass(getattr(bnb.optim, n), torch.optim.Optimizer)
                  and n != CONTROL and n not in CPU_BROKEN)


def bnb_optimizer(name: str, params):
    """bitsandbytes.optim.<name> over ``params``, with the settings the tests step it with."""
    import bitsandbytes as bnb

    kw = {"lr": 0.05}
    if name.startswith(("SGD", "LARS", "PytorchLARS")):
        kw["momentum"] = 0.9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(bnb.optim, name)(params, **kw)


def tbe(optim: str):
    """A CPU table-batched embedding (one 10x4 table) with fbgemm's fused optimizer ``optim``."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            optimizer=getattr(EmbOptimType, optim), learning_rate=0.1)


def ids():
    """The ids and offsets of two bags of a lookup."""
    import torch

    return torch.tensor([1, 2, 3, 7], dtype=torch.int64), torch.tensor([0, 2, 4], dtype=torch.int64)


def stale_lookup(optim: str):
    """A penalty on the table saved for backward, then a lookup whose backward updates the
    table in place (the fused optimizer), then the penalty's backward: (the embedding, its table,
    the penalty)."""
    t = tbe(optim)
    w = t.weights_host
    penalty = (w * w).sum()
    t(*ids()).sum().backward()
    return t, w, penalty


def embedding_then_lookup() -> None:
    """A program that feeds the same ids to F.embedding (which saves them for backward)
    and to an fbgemm lookup."""
    import torch

    emb = torch.nn.Embedding(10, 4)
    i, offsets = ids()
    y = emb(i)
    tbe("EXACT_SGD")(i, offsets)
    y.sum().backward()
