"""The saved-tensor check's renderers against their goldens (tests/golden/formats/saved.*): the
stderr line, the exception's message, the JSON and the count at exit, each as a person or a
program reads it. The goldens are made from findings written out by hand, so unlike the codegen's
they do not depend on the installed torch, and this test runs on every one."""

from __future__ import annotations

import json
import os

from tests.regen_goldens import GOLDEN, saved_goldens


def _golden(name: str) -> bytes:
    with open(os.path.join(GOLDEN, name), "rb") as fh:
        return fh.read()


def test_the_saved_checks_goldens_are_current():
    """Fails when a saved-check renderer's output changed: run `make goldens` and review the diff."""
    made = saved_goldens()
    assert sorted(made) == sorted(f"formats/{n}" for n in os.listdir(os.path.join(GOLDEN, "formats"))
                                  if n.startswith("saved."))
    for name, data in made.items():
        assert _golden(name) == data, f"stale golden: {name} (run `make goldens`)"


def test_the_goldens_show_each_place_a_finding_shows():
    lines = _golden("formats/saved.line").decode().splitlines()
    assert len(lines) == 7 and all(line.startswith("torchgen-patch: saved tensor changed without a version bump")
                                   for line in lines)
    assert "[rank 1]" in lines[0] and "[rank" not in "".join(lines[1:])
    # what a terminal would obey is shown escaped, in every renderer for people
    assert "\x1b" not in _golden("formats/saved.line").decode() + _golden("formats/saved.message").decode()
    findings = json.loads(_golden("formats/saved.json"))
    assert [f["writers"][0] for f in findings] == ["optimizer", "storage", "hooks", "data", "kernel", "alias",
                                                   "triton"]
    # every finding says what to change, the same words in each renderer
    message = _golden("formats/saved.message").decode()
    for f, text in zip(findings, lines, strict=True):
        assert f["fix"] and text.endswith("; fix: " + f["fix"]) and f"  fix:      {f['fix']}\n" in message
    assert "increment_version" in findings[4]["fix"] and "after the backward call at train.py:57" in findings[0]["fix"]
    # an optimizer's step: the line of its step() call, in what it wrote and in what to change; the program's
    # call of its model, where the forward frame is the model's own forward
    assert findings[0]["optimizer_step"] == {"file": "train.py", "line": 55, "function": "main"}
    assert "the optimizer bitsandbytes.optim.Adam8bit, whose step at train.py:55 (main) ran between" in lines[0]
    assert findings[0]["fix"].startswith("move the step of bitsandbytes.optim.Adam8bit at train.py:55 (main) after "
                                         "the backward call at train.py:57 (main)")
    assert "in the forward call at train.py:41 (forward), called from train.py:52 (main), used by" in lines[0]
    assert "            (called from train.py:52 (main))\n" in message
    # a Triton kernel launched between save and use: its name and the line that launched it, in each renderer
    assert findings[6]["triton_kernel"] == {"name": "_liger_cross_entropy_kernel", "file": "train.py", "line": 42,
                                            "function": "step"} and findings[0]["triton_kernel"] is None
    assert ("likely written by: the Triton kernel `_liger_cross_entropy_kernel` launched at train.py:42 (step), "
            "between save and use") in lines[6]
    assert findings[6]["fix"].startswith("after the kernel `_liger_cross_entropy_kernel` launched at train.py:42 "
                                         "(step), call `torch.autograd.graph.increment_version(t)` on the tensor it "
                                         "wrote, a tensor float32[8, 32000] on cuda:0")
    summary = _golden("formats/saved.summary").decode().splitlines()
    assert [s.split(": ", 2)[2].split(" (")[0] for s in summary] == ["0 changed saved tensors",
                                                                     "1 changed saved tensor",
                                                                     "5 changed saved tensors"]
