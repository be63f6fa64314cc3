"""An enabled environment's processes started with a cleared environment (``env -i``: no PATH, none of
the variables `enable` ran with): they build with the toolchain `enable` recorded, so they find its
builds and compile nothing; where a build fails in that toolchain, the failure is remembered and each
later start says so in one line (the compiler's last error line its reason) without compiling again."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.test_build_faults import _broken_compiler
from tests.test_enable import Env, wheel

pytestmark = pytest.mark.build
PROG = ("import torch\nx = torch.ones(3, requires_grad=True)\ny = torch.ones(3)\nz = (x * y).sum()\n"
        "z.backward()\nprint('backward done')\n")
NINJA = re.compile(r"^(?:\[\d+/\d+\] |FAILED: |ninja: )|compilation terminated", re.M)
CHECK_LINE = re.compile(r"^torchgen-patch: saved-tensor check on \(warn, every step\) in pid \d+ \([^)]*\): (.*)$",
                        re.M)


@pytest.fixture(scope="module")
def enabled(tmp_path_factory, wheel):
    """One environment enabled with --check-saved=warn, in the tests' cache and toolchain (its builds are
    the ones the other tests made); its data file as enable wrote it."""
    e = Env(tmp_path_factory.mktemp("clean") / "venv", wheel)
    e.enabled = e.tool("enable", "--check-saved=warn")
    assert e.enabled.returncode == 0, e.enabled.stderr
    e.data = os.path.join(e.site, "torchgen_patch_enable.json")
    with open(e.data, "rb") as fh:
        e.written = fh.read()
    return e


def _clean(env, cache, code=PROG):
    """``env -i`` (the cache named, nothing else): (its run, seconds it took)."""
    t = time.perf_counter()
    r = subprocess.run(["env", "-i", f"TORCHGEN_PATCH_CACHE={cache}", env.python, "-c", code], capture_output=True,
                       text=True, cwd=str(cache.parent) if hasattr(cache, "parent") else None, timeout=600)
    return r, time.perf_counter() - t


# the builds whose libraries the program has mapped, said after its own output (from /proc/self/maps)
LOADED = ("import os\nmaps = open('/proc/self/maps').read().split('\\n')\n"
          "for p in sorted({m.split()[-1] for m in maps if m.rstrip().endswith('.so')}):\n"
          "    print('loaded', os.path.basename(os.path.dirname(p)))\n")


def _loaded(stdout: str) -> set[str]:
    return {line.split(" ", 1)[1] for line in stdout.splitlines() if line.startswith("loaded ")}


def _builds(cache) -> list[str]:
    d = os.path.join(cache, "builds")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def test_clean_starts_of_an_enabled_environment_compile_nothing(enabled):
    """Three `env -i` starts in a row: the check's native hooks and the kernels from enable's builds (found
    by the recorded toolchain's keys: its compiler, its PATH, its flags), nothing compiled, each as fast as
    a start that imports torch. Before, each start compiled the check's hooks with /bin/c++ and no PATH
    (another key), failed to link (no ld), and said so with no reason: 17 to 35 s a start."""
    from torchgen_patch.fs import root as cache_root

    root = cache_root.directory()
    before = _builds(root)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", PROG], check=True, capture_output=True)
    alone = time.perf_counter() - t  # the same program, not enabled: what importing torch costs here now
    for i in range(3):
        r, took = _clean(enabled, root, PROG + LOADED)
        assert r.returncode == 0 and r.stdout.startswith("backward done\nloaded "), r.stderr
        assert "compiling" not in r.stderr and not NINJA.search(r.stderr), r.stderr
        [line] = CHECK_LINE.findall(r.stderr)
        assert line.startswith("native hooks (CPU fingerprint: "), r.stderr
        assert re.search(r"^torchgen-patch: \d+ kernels active \(cpp\), 0 refused, from the cached build", r.stderr,
                         re.M), r.stderr
        used = {b for b in _loaded(r.stdout) if b.startswith("build-")}
        assert len(used) == 2 and used <= set(before), (used, before)  # the kernels and the hooks, both found
        pid = re.search(r"in pid (\d+) ", r.stderr).group(1)
        assert not [b for b in _builds(root) if f"-{pid}-" in b]  # and no build of its own started
        if "PYTEST_XDIST_WORKER" not in os.environ:  # alone, the directory itself: other tests build beside xdist's
            assert _builds(root) == before
        if i:
            assert took < max(3.0, 2 * alone), (took, alone)
    spec = json.loads(enabled.written)  # what enable ran with
    assert spec["toolchain"]["cxx"] and spec["toolchain"]["path"] == os.environ["PATH"]
    assert spec["toolchain"]["cflags"] == os.environ.get("TORCHGEN_PATCH_EXTRA_CFLAGS", "")
    said = enabled.enabled.stdout  # enable made the check's hooks ready too: the processes compile nothing
    assert re.search(r"; the saved-tensor check's native hooks (from the cached build|built now)\)", said), said


def _with(env, **fields):
    """The data file as enable wrote it, with ``fields`` changed (what `enable` would have written with
    another toolchain, or naming a build that is gone)."""
    spec = json.loads(env.written)
    spec.update(fields)
    with open(env.data, "w") as fh:
        json.dump(spec, fh, sort_keys=True)


def _calls(log) -> int:
    with open(log) as fh:
        return fh.read().count("\n")


def _three_broken_starts(env, tmp_path, gone: bool = False):
    """Three clean starts of ``env`` whose recorded toolchain's compiler fails every compile (``gone``: and
    the build the data file names is gone): yields (which start, its stderr), once the program ran to its
    end, the compiler ran at the first start only and no line of ninja's reached stderr."""
    cxx, log = _broken_compiler(tmp_path)
    cache = tmp_path / "cache"
    gone_library = {"library": str(cache / "builds" / "build-gone" / "torchgen_patch_kernels_gone.so")} if gone else {}
    # the check's hooks never built in that toolchain: the data file names none (enable names the build it made)
    ninja = os.path.dirname(shutil.which("ninja") or "/usr/bin/ninja")  # where this machine has it (a venv's bin)
    _with(env, toolchain={"cxx": cxx, "path": f"{os.path.dirname(cxx)}:{ninja}:/usr/bin:/bin", "cflags": ""},
          saved_library=None, **gone_library)
    try:
        for i in range(3):
            n = _calls(log)
            r, _ = _clean(env, cache)
            assert r.returncode == 0 and r.stdout == "backward done\n", r.stderr
            assert (_calls(log) > n) == (i == 0), (i, open(log).read())
            assert not NINJA.search(r.stderr) and ("compiling" in r.stderr) == (i == 0), r.stderr
            yield i, r.stderr
    finally:
        with open(env.data, "wb") as fh:
            fh.write(env.written)


def test_a_check_that_does_not_compile_says_one_line_with_the_compilers_reason_and_compiles_once(enabled,
                                                                                                  tmp_path):
    """enable ran with a toolchain in which the check's hooks do not compile: the first clean start tries
    (its compiler runs), the check runs on its Python hooks and says so in one line whose reason is the
    compiler's last error line, no line of ninja's; the next two starts run no compiler and say the same,
    remembered. Before, the reason was empty ("do not compile:)") and every start compiled again."""
    for i, err in _three_broken_starts(enabled, tmp_path):
        [line] = CHECK_LINE.findall(err)
        assert line.startswith("Python hooks (the saved-tensor check's native hooks do not compile: c++: fatal "
                               "error: no assembler in this toolchain"), line
        assert ("(remembered: the build with " in line) == (i > 0), line
        assert sum("saved-tensor check's native hooks" in x for x in err.splitlines()) == 1, err


def test_kernels_whose_named_build_is_gone_compile_once_in_a_clean_start(enabled, tmp_path):
    """The build the data file names is gone and none can be made in the recorded toolchain: the first
    clean start tries (the compiler runs) and runs unpatched, said in one line whose reason is the
    compiler's last error line; the next two run no compiler and say it remembered. Before: a 12-line
    message of ninja's log at each start, and a compile each time."""
    for i, err in _three_broken_starts(enabled, tmp_path, gone=True):
        lines = [x for x in err.splitlines() if not x.startswith("torchgen-patch: compiling ")]
        assert len(lines) == 1 and lines[0].startswith("torchgen-patch: NOT active in pid "), err
        assert "running unpatched: " in lines[0] and "and none can be had instead: the generated kernels do not " \
               "compile: c++: fatal error: no assembler in this toolchain" in lines[0], lines[0]
        assert ("(remembered: the build with " in lines[0]) == (i > 0), lines[0]
