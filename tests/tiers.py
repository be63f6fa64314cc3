"""The marks tests/conftest.py gives each item from what it uses, so that a short run can leave out
what costs time and say what it left out:

- ``build``: compiles C++ (the kernels, the check's native library, DeepSpeed's ops, a wheel's
  extension): it asks for a fixture that builds, or carries the mark itself;
- ``venv``: makes a virtual environment (and installs a wheel into it);
- ``program``: starts another process (a Python program, the CLI as a user runs it, a compiler);
- ``slow``: took more than SLOW_S (5) seconds, setup included, in the measurement committed in
  tests/durations.json (``make durations`` rewrites it from the log of a whole run); ``long``: more
  than LONG_S (1), which the short tier leaves out to stay under 3 minutes on 2 cores;
- ``core``: what the short tier runs whatever it takes (the package's self-check: ruff and mypy);
- ``sampled``: a case of a large family of like cases of which the short tier runs one in N
  (SAMPLES: the hostile yaml, bitsandbytes' optimizers, the flags of commands other than scan, lint
  and gen).

``make check`` leaves out ``build``, ``venv``, ``sampled`` and ``long`` items but ``core`` ones;
``make test`` runs them all."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re

SLOW_S = 5.0
LONG_S = 1.0
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")

CORE_FILES = frozenset({"tests/test_selfcheck.py"})
# test function -> (one case in how many the short tier runs, cases it always runs)
SAMPLES = {
    "tests/test_adversarial_yaml.py::test_hostile_input_is_bounded_and_clean": (4, None),
    "tests/test_optim.py::test_a_shipped_bitsandbytes_entry_makes_a_step_before_backward_raise_and_changes_no_result":
        (8, None),
    "tests/test_cli_flags.py::test_flag_is_honoured": (3, re.compile(r"\[(scan|lint|gen)-")),
    "tests/test_cli_flags.py::test_input_flag_reaches_the_pipeline": (3, re.compile(r"\[(scan|lint|gen)-")),
}
# fixtures (and what they need) that compile something
# (item.fixturenames holds every fixture an item needs, those its fixtures need too)
BUILD_FIXTURES = frozenset({"library", "deepspeed_ops", "native_module", "native_hooks", "fused_ops", "wheel_run"})
# parameters of fixtures that ask for a building one while the test runs (request.getfixturevalue)
BUILD_PARAMS = frozenset({("kernels", "cpp"), ("check_path", "native"), ("path", "native")})
# fixtures that make a virtual environment or install a wheel
VENV_FIXTURES = frozenset({"wheel", "env", "enabled", "user_venv", "installed"})
# a test function whose own text starts a process
_STARTS_A_PROCESS = re.compile(r"\bsubprocess\.|\bsys\.executable\b|\bPopen\(|\btgp_run\(|\b_cli\(|\.tool\(")


def load_durations(path: str = DURATIONS) -> dict[str, float]:
    """node id -> seconds, from the committed measurement; empty where there is none."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return {}
    return {k: float(v) for k, v in doc["seconds"].items()}


@functools.cache
def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def marks_for(item, durations: dict[str, float]) -> list[str]:
    """The marks ``item`` gets from what it uses (the fixtures it asks for, its own text) and from
    its measured duration."""
    names = set(getattr(item, "fixturenames", ()))
    own = {m.name for m in item.iter_markers()}
    marks = []
    params = getattr(getattr(item, "callspec", None), "params", {})
    if names & BUILD_FIXTURES or "build" in own or any(params.get(k) == v for k, v in BUILD_PARAMS):
        marks.append("build")
    if names & VENV_FIXTURES:
        marks.append("venv")
    if _STARTS_A_PROCESS.search(_source(getattr(item, "function", None))):
        marks.append("program")
    took = durations.get(item.nodeid, 0.0)
    marks += ["long"] if took > LONG_S else []
    marks += ["slow"] if took > SLOW_S else []
    if item.nodeid.split("::")[0] in CORE_FILES:
        marks.append("core")
    return marks


def sampled(node_ids) -> set[str]:
    """The ids (in collection order) of the cases SAMPLES leaves to the whole run: of each family's
    cases not always run, all but the first of every N."""
    seen: dict[str, int] = {}
    out = set()
    for node_id in node_ids:
        family = node_id.split("[", 1)[0]
        if family not in SAMPLES:
            continue
        n, always = SAMPLES[family]
        if always is not None and always.search(node_id):
            continue
        if seen.get(family, 0) % n:
            out.add(node_id)
        seen[family] = seen.get(family, 0) + 1
    return out
