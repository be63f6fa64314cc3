"""Optimizer classes for the optimizer entries and the lint's probe step (tests/test_optim.py):
each writes its parameters one way autograd does or does not see."""

from __future__ import annotations

import os

import torch
from torch.optim.optimizer import required


class _Base(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    def _each(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield group, p


class NumpyWriter(_Base):
    """Writes through a numpy view of the parameter: outside the dispatcher, no version moves."""

    @torch.no_grad()
    def step(self, closure=None):
        for group, p in self._each():
            p.detach().numpy()[...] -= group["lr"] * p.grad.numpy()


class DataWriter(_Base):
    """Writes through ``p.data``, an alias whose version counter is its own."""

    @torch.no_grad()
    def step(self, closure=None):
        for group, p in self._each():
            p.data.add_(p.grad, alpha=-group["lr"])


class AtenWriter(_Base):
    """Writes with an aten in-place op on the parameter itself: its version moves."""

    @torch.no_grad()
    def step(self, closure=None):
        for group, p in self._each():
            p.add_(p.grad, alpha=-group["lr"])


class StatefulNumpyWriter(_Base):
    """Like NumpyWriter, and keeps a momentum buffer in its state, written the same way."""

    @torch.no_grad()
    def step(self, closure=None):
        for group, p in self._each():
            state = self.state[p]
            if "momentum" not in state:
                state["momentum"] = torch.zeros_like(p)  # created by this step
            state["momentum"].detach().numpy()[...] = 0.9 * state["momentum"].numpy() + p.grad.numpy()
            p.detach().numpy()[...] -= group["lr"] * state["momentum"].numpy()


class NeedsLr(torch.optim.Optimizer):
    """No default learning rate (torch's ``required``): the probe passes ``lr=``; writes through numpy."""

    def __init__(self, params, lr=required):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.detach().numpy()[...] -= group["lr"] * p.grad.numpy()


class NeedsConfig(_Base):
    """Cannot be constructed with its defaults."""

    def __init__(self, params, config):
        super().__init__(params)


class StepFails(_Base):
    def step(self, closure=None):
        raise RuntimeError("this optimizer needs a distributed group")


class DoesNothing(_Base):
    """Its step changes nothing (a warm-up that never ends)."""

    def step(self, closure=None):
        return None


class PrintsInC(NumpyWriter):
    """Writes to file descriptor 1 when constructed, as C++ extensions' printf does."""

    def __init__(self, params, lr=0.1):
        os.write(1, b"PrintsInC was created\n")
        print("PrintsInC says hello")
        super().__init__(params, lr)


class StepPerInstance(NumpyWriter):
    """Replaces ``step`` on each instance (as DeepSpeed's ZenFlowCPUAdam does): torch's step hooks
    wrap the class's ``step`` only."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, lr)
        self.step = self._own_step

    @torch.no_grad()
    def _own_step(self, closure=None):
        for group, p in self._each():
            p.detach().numpy()[...] -= group["lr"] * p.grad.numpy()


class NeedsMomentum(NumpyWriter):
    """Refuses its own default ``momentum=0`` (as bitsandbytes' SGD and LARS do): the probe switches
    momentum on."""

    def __init__(self, params, lr=0.1, momentum=0):
        if momentum == 0:
            raise NotImplementedError("NeedsMomentum without momentum is not supported!")
        super().__init__(params, lr)


class StepNeedsMomentum(AtenWriter):
    """Constructs with ``momentum=0`` but its step fails without momentum (as bitsandbytes'
    PytorchLARS does); with momentum it writes with aten ops: it bumps."""

    def __init__(self, params, lr=0.1, momentum=0):
        super().__init__(params, lr)
        self.momentum = momentum

    def step(self, closure=None):
        if not self.momentum:
            raise UnboundLocalError("cannot access local variable 'update' where it is not associated with a value")
        return super().step(closure)


class MomentumDoesNotHelp(NumpyWriter):
    """Fails with its defaults and with momentum on: both reasons are reported."""

    def __init__(self, params, lr=0.1, momentum=0):
        raise ValueError(f"this optimizer needs a mesh (momentum={momentum})")


class NeedsName(NumpyWriter):
    """Takes another argument before its parameters (as bitsandbytes' Optimizer1State does): the
    probe passes the parameters by name, so the error names what is missing."""

    def __init__(self, optimizer_name, params, lr=0.1):
        super().__init__(params, lr)


class NeedsHyperparameters(NumpyWriter):
    """No default for its hyperparameters: the probe gives the common ones."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        assert betas == (0.9, 0.999) and eps == 1e-8 and weight_decay == 0.0
        super().__init__(params, lr)
