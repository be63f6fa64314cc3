"""Small helpers the tests share: the pipeline's stages called with test inputs."""

from __future__ import annotations

import importlib.util
import os
import types

from torchgen_patch.codegen import template_names
from torchgen_patch.plan import overlay as ov
from torchgen_patch.scan import scan
from torchgen_patch.sources import Options, installed_torch_version, resolve


def packaged_yaml() -> tuple[str, str]:
    """The installed torchgen's native_functions.yaml and tags.yaml."""
    s = resolve(Options(no_overlay=True))
    return s.native, s.tags


def scan_of(native: str | None = None, tags: str | None = None, root: str | None = None, cache: bool = True):
    return scan(resolve(Options(native, tags, root, no_overlay=True)), use_cache=cache)


def overlay_of(path: str, sc):
    """``path`` as a user-given overlay (every check strict) for the scan ``sc``."""
    s = resolve(Options(sc.sources.native, sc.sources.tags, sc.sources.root, overlay=path)) \
        if sc.sources.world == "installed" else resolve(Options(pytorch_root=sc.sources.root, overlay=path))
    return ov.load(s, sc, template_names())


def torch_is(prefix: str) -> bool:
    return installed_torch_version().startswith(prefix)


def train_mlp(make_optimizer, steps: int, width: int = 64):
    """A small MLP (``width`` wide) trained on one fixed batch for ``steps`` steps with the optimizer
    ``make_optimizer(params)`` makes: (the losses, the model)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    opt = make_optimizer(model.parameters())
    x, y = torch.randn(32, width), torch.randn(32, 1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def script(name: str) -> types.ModuleType:
    """scripts/<name>.py, loaded as a module (scripts/ is no package), once: registered under its
    name while it runs, as an import would (its dataclasses look their module up there)."""
    import sys

    if name in sys.modules:
        return sys.modules[name]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# DeepSpeed's C++ ops that its CPU optimizers use, by the op builder that makes each: DeepSpeedCPUAdam,
# DeepSpeedCPUAdagrad, DeepSpeedCPULion and FusedAdam's CPU build
DEEPSPEED_OPS = {"cpu_adam": "CPUAdamBuilder", "cpu_adagrad": "CPUAdagradBuilder", "cpu_lion": "CPULionBuilder",
                 "fused_adam": "FusedAdamBuilder"}
_BUILDING: dict = {}  # op -> (the process building it and maybe others, the file its stderr goes to)


def _deepspeed_library(name: str) -> str:
    from torch.utils.cpp_extension import _get_build_directory  # where torch's JIT loader (DeepSpeed's) builds

    return os.path.join(_get_build_directory(name, False), name + ".so")


def start_deepspeed_builds(names) -> None:
    """Start building those of DeepSpeed's ops ``names`` (keys of DEEPSPEED_OPS) that are neither
    built nor being built, as DeepSpeed builds them on first use (its op builder's load(), into
    TORCH_EXTENSIONS_DIR, its flags); returns at once. One process (and process group) per core
    builds its share of them one after another, one compiler each: a compiler of these takes about
    2 GB, so no more run at once than there are cores (on many cores, each build gets several)."""
    import subprocess
    import sys
    import tempfile

    todo = sorted(n for n in names if n not in _BUILDING and not os.path.exists(_deepspeed_library(n)))
    cores = len(os.sched_getaffinity(0))
    slots = min(cores, len(todo))
    jobs = os.environ.get("MAX_JOBS") or str(max(1, cores // max(1, len(todo))))  # torch's ninja reads it
    for share in (todo[k::slots] for k in range(slots)):
        err = tempfile.TemporaryFile()
        code = "import warnings; warnings.simplefilter('ignore'); import deepspeed.ops.op_builder as b; " + \
            "; ".join(f"b.{DEEPSPEED_OPS[n]}().load()" for n in share)
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=err,
                                env=dict(os.environ, MAX_JOBS=jobs), start_new_session=True)
        _BUILDING.update({n: (proc, err) for n in share})


def deepspeed_arch_list() -> dict[str, str]:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed's JIT builder can read it (tests/conftest.py sets it so for the
    session and its children): it parses each entry as numbers
    (and +PTX), so an architecture-specific one such as ``9.0a`` (torch's own builds accept it)
    becomes ``9.0``; unset, DeepSpeed asks the device, and it stays unset."""
    import re

    given = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not given:
        return {}
    return {"TORCH_CUDA_ARCH_LIST": re.sub(r"\b(\d+\.\d+)[a-z]+\b", r"\1", given)}


def build_deepspeed_ops(names) -> dict[str, str]:
    """DeepSpeed's ops ``names`` built (start_deepspeed_builds, then waited for); op -> its library."""
    start_deepspeed_builds(names)
    failed = {}
    for n in names:
        proc, err = _BUILDING.get(n, (None, None))
        if proc is not None and proc.wait() != 0:
            err.seek(0)
            failed[n] = err.read()[-2000:].decode(errors="replace")
    assert not failed, failed
    return {n: _deepspeed_library(n) for n in names}


def cancel_deepspeed_builds() -> None:
    """Stop the builds still running, as Ctrl-C would (SIGINT to each one's process group, so that
    torch's loader releases its build directory's lock file), wait for them, and end what they
    leave behind: ninja runs each compiler in a process group of its own, within the builder's
    session."""
    import signal

    procs = {proc.pid: (proc, err) for proc, err in _BUILDING.values()}  # a process builds several ops
    running = [pid for pid, (proc, _) in procs.items() if proc.poll() is None]
    for pid in running:
        os.killpg(pid, signal.SIGINT)
    for proc, err in procs.values():
        proc.wait()
        err.close()
    _BUILDING.clear()
    for pid in _in_sessions(set(running)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _in_sessions(sessions: set[int]) -> list[int]:
    """The processes whose session is one of ``sessions`` (Linux's /proc)."""
    found = []
    for d in os.listdir("/proc") if sessions else ():
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # after the command: state ppid pgrp session
        except (OSError, IndexError):
            continue
        if d.isdigit() and int(fields[3]) in sessions:
            found.append(int(d))
    return found


def root_env(**extra) -> dict[str, str]:
    """The environment for a child that imports this tree: ROOT first on PYTHONPATH, what was there
    kept (a machine without an index may carry packages, DeepSpeed among them, on PYTHONPATH)."""
    from tests.conftest import ROOT

    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)
