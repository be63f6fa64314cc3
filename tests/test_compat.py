"""The compatibility battery: the patch changes version counters and nothing else.

Every scenario of tests/compat_scenarios.py (torch.compile with inductor, a
compiled optimizer step, a compiled model trained with fused AdamW,
FakeTensorMode, meta tensors, functionalize, make_fx, aot_function, vmap,
inference mode, autocast, torch.jit.trace, non-reentrant checkpointing,
DTensor, an out= op given an input that requires grad) runs in two fresh processes, unpatched and patched (each
with its own empty inductor cache), and their outcomes — the value computed, or the
exception's type and first line — must be identical, except in the INTENDED
scenarios (an out= op given an input that requires grad: refused patched).
Version counters may differ only where ALLOWED lists the difference. A third process runs the
battery patched with the saved-tensor check on (``raise``): its outcomes and counters must be the
patched ones exactly, with no finding.

COMPAT_REPORT=FILE also writes the side-by-side report (reports/compat-*.md).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.support import torch_is

pytestmark = pytest.mark.build

# (scenario, counter) -> (unpatched on CPU with torch 2.13, patched): every difference the patch makes.
# The patched value is the rule (+1 per call for every tensor an op writes); the unpatched one is
# whatever the backend did, checked on CPU with torch 2.13 only (CUDA backends bump differently: see the verify
# reports).
ALLOWED = {
    # fused AdamW (_fused_adamw_) did not bump the parameters it writes: one bump per step now (3 steps;
    # the 1 both runs share comes from the compiled model's first call)
    ("compiled_model_trained_with_fused_adamw", "params"): ([1, 1, 1, 1], [4, 4, 4, 4]),
    # the same for a compiled fused step (2 steps)
    ("compiled_optimizer_step_fused", "params"): ([1, 1, 1, 1], [3, 3, 3, 3]),
    # DTensor's wrapper counter now moves on _foreach_add_ (the inner tensors' always did)
    ("dtensor", "xs"): ([0, 0], [1, 1]),
    # FakeTensor counters now move, as a real tensor's do
    ("fake_tensor_mode", "xs"): ([0, 0], [1, 1]),
    ("fake_tensor_mode", "y"): (0, 1),
    ("fake_tensor_mode", "z"): (0, 1),
    # a meta out= tensor resized and copied into was bumped twice; once per call now
    ("meta_tensors", "y"): (2, 1),
    ("meta_tensors", "z"): (2, 1),
    # views of one base passed together: on CPU their shared counter advances once per call, not once
    # per view; on CUDA (H200, torch 2.11) it advances once per view, patched as unpatched (DEVICE_PATCHED)
    ("views_of_one_base", "base"): (2, 1),
    ("views_of_one_base", "v0"): (2, 1),
    ("views_of_one_base", "v1"): (2, 1),
}
# Scenarios whose outcome the patch changes on purpose: an out= op that returns nothing given an input that
# requires grad in grad mode went through and lost the gradient; patched it raises PyTorch's own out= message, as
# add(out=) does (also under aot_function, which traces in grad mode: add(out=) raises there too).
REFUSED = "RuntimeError: split_with_sizes_copy(): functions with out=... arguments don't support automatic " \
          "differentiation, but one of the arguments requires grad."
INTENDED = {"out_with_requires_grad_input": REFUSED, "aot_function": REFUSED}
# Scenarios a release's own torch cannot run, patched or not (measured): torch 2.4.1's DTensor fails
# inside its own mm sharding strategy on one rank (IndexError), before any op of the plan runs.
UNRUNNABLE = {"2.4.1": ("dtensor",)}
# Where a device's patched value differs from ALLOWED's (measured; reports/compat-cuda-torch2.11.0.md).
DEVICE_PATCHED = {
    ("cuda", "views_of_one_base", "base"): 2, ("cuda", "views_of_one_base", "v0"): 2,
    ("cuda", "views_of_one_base", "v1"): 2,
}
# Outcomes that are exceptions in both runs, so the battery says so rather than hides it.
RAISE_IN_BOTH = {
    # vmap has no batching rule for in-place foreach ops, patched or not
    "vmap": "RuntimeError: Batching rule not implemented for aten::_foreach_mul_.Scalar.",
    # writing an inference tensor outside inference mode is refused, patched or not
    "inference_tensor_written_outside_inference_mode":
        "RuntimeError: Inplace update to inference tensor outside InferenceMode is not allowed.",
}


def _launch(device, patched, tmp, check=""):
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor-{patched}{check}"),
               TRITON_CACHE_DIR=str(tmp / f"triton-{patched}{check}"), COMPAT_CHECK_SAVED=check)
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "compat_scenarios.py"), device,
                             "1" if patched else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _outcomes(proc):
    out, err = proc.communicate(timeout=1500)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _same(b, a) -> bool:
    return (b.get("value"), b.get("raises")) == (a.get("value"), a.get("raises"))


def _report(device, before, after, diffs) -> str:
    lines = ["# Compatibility battery: unpatched vs patched", "",
             f"- torch: `{torch.__version__}`, device: `{device}`" + (
                 f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""),
             "- command: `COMPAT_REPORT=FILE python -m pytest tests/test_compat.py -k " + device + "`",
             f"- scenarios: {len(before)}; outcomes identical: {sum(_same(before[k], after[k]) for k in before)}"
             + (f"; different on purpose: {', '.join(f'`{k}`' for k in sorted(INTENDED))} (an out= op given an input "
                "that requires grad: refused, with PyTorch's own message)"),
             "", "| scenario | outcome (both) | counters that differ (unpatched -> patched) |", "|---|---|---|"]
    for k in sorted(before):
        outcome = ("same value" if "value" in before[k] else f"same exception: {before[k]['raises'][:90]}") \
            if _same(before[k], after[k]) else "refused patched (intended)" if k in INTENDED else "**DIFFERENT**"
        d = "; ".join(f"{c}: {u} -> {p}" for (s, c), (u, p) in sorted(diffs.items()) if s == k) or "none"
        lines.append(f"| `{k}` | {outcome} | {d} |")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])])
def test_the_patch_changes_version_counters_and_nothing_else(library, device, tmp_path):
    procs = [_launch(device, False, tmp_path), _launch(device, True, tmp_path),
             _launch(device, True, tmp_path, "raise")]
    before, after, checked = [_outcomes(p) for p in procs]
    assert set(before) == set(after) and len(before) == 19
    # the saved-tensor check on, patched: every outcome and counter exactly as patched without it, no finding
    assert {k: (v.get("value"), v.get("raises"), v["versions"]) for k, v in checked.items()} == \
        {k: (v.get("value"), v.get("raises"), v["versions"]) for k, v in after.items()}
    assert all(v["saved"]["findings"] == 0 for v in checked.values())
    assert sum(v["saved"]["checked"] for v in checked.values()) > 0
    diffs = {}
    for k, refused in INTENDED.items():  # silent unpatched, PyTorch's out= refusal patched
        assert "value" in before[k] and after[k].get("raises") == refused, (k, before[k], after[k])
    assert before["out_with_requires_grad_input"]["value"][-1] is False  # the gradient was lost
    for k in sorted(set(before) - set(INTENDED)):
        b, a = before[k], after[k]
        assert _same(b, a), k
        for c in sorted(set(b["versions"]) | set(a["versions"])):
            if b["versions"].get(c) != a["versions"].get(c):
                diffs[(k, c)] = (b["versions"].get(c), a["versions"].get(c))
    if os.environ.get("COMPAT_REPORT"):
        with open(os.environ["COMPAT_REPORT"], "w") as f:
            f.write(_report(device, before, after, diffs))
    assert set(diffs) <= set(ALLOWED), sorted(set(diffs) - set(ALLOWED))
    # a scenario this release's torch cannot run at all, unpatched as patched (the same exception: _same above)
    unrunnable = {k for k in UNRUNNABLE.get(torch.__version__.split("+")[0], ()) if "raises" in before[k]}
    for key, (unpatched, patched) in ALLOWED.items():
        if key[0] in unrunnable:
            continue
        assert after[key[0]]["versions"][key[1]] == DEVICE_PATCHED.get((device, *key), patched), key
        if device == "cpu" and torch_is("2.13"):
            assert diffs.get(key) == (unpatched, patched), key
    for k, first in RAISE_IN_BOTH.items():
        assert before[k]["raises"].startswith(first), before[k]
    assert not [k for k in before if "raises" in before[k] and k not in RAISE_IN_BOTH and k not in unrunnable]


# The import-time settings scenario: a program of its own (tests/import_time_probe.py), since what it
# checks happens before and during the program's own `import torch`. It sets OMP_NUM_THREADS and
# TORCH_CUSTOM_TERMINATE before that import and then aborts as PyTorch's own
# TestTorch.test_terminate_handler_on_crash does; run directly and under `torchgen-patch run`.
CRASH_HANDLER = "Unhandled exception caught in c10/util/AbortHandler.h"


def test_import_time_settings_reach_torch_as_without_run(library):
    probe = [sys.executable, os.path.join(ROOT, "tests", "import_time_probe.py"), "abort"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    plain = subprocess.run(probe, capture_output=True, text=True, env=env)
    under = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "--", *probe], capture_output=True,
                           text=True, env=env)
    assert (plain.returncode, under.returncode) == (-6, 134), under.stderr[-2000:]  # SIGABRT; run: like a shell
    first = [json.loads(r.stdout.splitlines()[0]) for r in (plain, under)]
    assert first[0]["threads"] == 1 and first[1] == first[0]
    assert CRASH_HANDLER in plain.stdout and CRASH_HANDLER in under.stdout  # the handler writes to stdout
    assert "kernels active (cpp)" in under.stderr
