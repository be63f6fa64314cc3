"""Optimizer classes for the lint's probe on a device (tests/test_optim_cuda.py): classes that
refuse CPU tensors, as DeepSpeed's fused optimizers do."""

from __future__ import annotations

import torch


class _Base(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})


class CudaOnlyDataWriter(_Base):
    """Steps CUDA tensors only, writing through ``p.data`` (a version counter of its own)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not p.is_cuda:
                    raise RuntimeError("expected input to be on cuda")
                p.data.add_(p.grad, alpha=-group["lr"])


class RefusesItsFirstParameter(_Base):
    """Cannot be constructed the first time after ``refused`` is reset (a stand-in, on a machine
    without a GPU, for a class that refuses a CPU parameter and takes the accelerator's); then
    writes through a numpy view."""

    refused = False

    def __init__(self, params, lr=0.1):
        if not RefusesItsFirstParameter.refused:
            RefusesItsFirstParameter.refused = True
            raise RuntimeError("expected input to be on cuda")
        super().__init__(params, lr)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.detach().numpy()[...] -= group["lr"] * p.grad.numpy()


class NeverConstructs(_Base):
    """Refuses every construction, on any device."""

    def __init__(self, params, lr=0.1):
        raise RuntimeError("this optimizer needs a process group")
