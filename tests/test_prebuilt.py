"""The prebuilt kernels wheel (`torchgen-patch wheel`), end to end: built with pip, installed
into a fresh venv that has the same torch and no compiler on PATH, where install() registers
every op without compiling; a wheel for another torch build, a damaged or missing library, two
copies installed: refused with the reason (build=False) or the cached build instead."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.build


def _site(venv) -> str:
    return str(venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages")


def _venv(path, wheel) -> str:
    """A fresh venv (no pip, no compiler) that sees this torch (a .pth to its site-packages, whose own
    .pth files stay unread) and has the kernels wheel installed by pip; returns its python."""
    import torch

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    with open(os.path.join(_site(path), "same-torch.pth"), "w") as fh:
        fh.write(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(path / "bin" / "python")


@pytest.fixture(scope="module")
def wheel_run(tmp_path_factory):
    """`torchgen-patch wheel -q`: (its run, the output directory)."""
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "wheel", "-q", "-o", str(out)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT, MAX_JOBS="2"), timeout=1800)
    assert r.returncode == 0, r.stderr
    return r, out


@pytest.fixture(scope="module")
def wheel(wheel_run):
    r, out = wheel_run
    path = r.stdout.strip()
    assert os.path.dirname(path) == str(out) and os.listdir(out) == [os.path.basename(path)]
    return path


def test_wheel_q_prints_the_wheel_and_nothing_else(wheel_run, wheel):
    r, _ = wheel_run
    assert r.stdout == wheel + "\n" and r.stderr == ""


EDITED_RECORD = """
import json, sys, torch, torchgen_patch
from torchgen_patch.errors import ToolError
torch.__version__, torch.version.git_version = "2.14.1", "f" * 40  # this process is another torch
try:
    torchgen_patch.install(build=False)
    print("installed", torchgen_patch.installed_ops()[:1])
except ToolError as e:
    print(e.render(), file=sys.stderr)
    sys.exit(e.exit_code)
"""


def test_a_wheel_whose_record_was_edited_to_another_torch_is_refused_by_its_library(wheel, tmp_path):
    """The record says torch 2.14.1 (edited), and the process is torch 2.14.1: the record fits, but the
    library states the torch it was built against, which decides: refused, one line, nothing active."""
    python = _venv(tmp_path / "venv", wheel)
    rec_path = os.path.join(_site(tmp_path / "venv"), "torchgen_patch_kernels", "record.json")
    rec = json.load(open(rec_path))
    built_for = rec["torch"]["version"]
    rec["torch"].update(version="2.14.1", git_version="f" * 40)
    json.dump(rec, open(rec_path, "w"))
    r = _run(python, EDITED_RECORD, str(tmp_path / "venv" / "bin"), tmp_path / "cache")
    assert r.returncode == 3 and r.stdout == "" and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    [line] = r.stderr.splitlines()
    assert line.startswith("torchgen-patch: error: ") and " was built against another torch: version " \
        f"{built_for!r} (this torch: '2.14.1'); git_version " in line and line.count("it is not registered") == 1, line


def _run(python, code, path, cache, extra_path=None):
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "PYTHONPATH")}
    env.update(PATH=path, TORCHGEN_PATCH_CACHE=str(cache),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, extra_path) if p))
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=str(cache.parent),
                          timeout=600)


def test_wheel_names_the_torch_build_and_records_the_library(wheel, default_plan):
    import torch

    from torchgen_patch.runtime import prebuilt
    from torchgen_patch.runtime.compile.key import TorchIdentity

    name = os.path.basename(wheel)
    here = TorchIdentity.here()
    assert name.startswith(f"torchgen_patch_kernels-{prebuilt.wheel_version(here)}-cp3")
    assert name.endswith("_x86_64.whl") or name.endswith("_aarch64.whl")  # a platform wheel
    variant = "cpu" if torch.version.cuda is None else "cu" + torch.version.cuda.replace(".", "")
    abi = "cxx11abi" if torch.compiled_with_cxx11_abi() else "precxx11abi"
    assert prebuilt.wheel_version(here) == (f"{prebuilt.__version__}+torch{torch.__version__.split('+')[0]}."
                                            f"{variant}.{abi}.g{torch.version.git_version[:10]}")
    with zipfile.ZipFile(wheel) as z:
        rec = json.loads(z.read(f"{prebuilt.PACKAGE}/{prebuilt.RECORD}"))
        lib = z.read(f"{prebuilt.PACKAGE}/{rec['library']}")
        assert "Root-Is-Purelib: false" in z.read(next(n for n in z.namelist() if n.endswith("/WHEEL"))).decode()
    import hashlib

    assert hashlib.sha256(lib).hexdigest() == rec["sha256"]
    assert rec["torch"] == here.to_json() and rec["torchgen_patch"] == prebuilt.__version__
    assert [k["op"] for k in rec["plan"]["kernels"]] == default_plan.ops()


NO_COMPILER = """
import json, os, shutil, torch, torchgen_patch
from torchgen_patch.errors import ToolError
from torchgen_patch.runtime import prebuilt
assert not any(shutil.which(c) for c in ("c++", "g++", "gcc", "cc", "clang++", "ninja")), os.environ["PATH"]
res = {}
rep = torchgen_patch.install(build=False)
x = torch.randn(2, 2); a, b = torch.empty(2, 1), torch.empty(2, 1)
torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[a, b])
res["ok"] = {"registered": rep.registered, "refused": rep.refused, "prebuilt": rep.prebuilt,
             "library": rep.library, "versions": [a._version, b._version]}
torchgen_patch.uninstall()
where = os.path.dirname(rep.library)
rec_path = os.path.join(where, prebuilt.RECORD)
good_rec, good_lib = open(rec_path).read(), open(rep.library, "rb").read()

def replace(path, data):  # a new file: the loaded library's mapping must not change under this process
    open(path + ".new", "wb").write(data)
    os.replace(path + ".new", path)

def attempt(name):
    try:
        torchgen_patch.install(build=False)
        res[name] = "installed"
    except ToolError as e:
        res[name] = [e.exit_code, str(e), torchgen_patch.installed_ops()]
    torchgen_patch.uninstall()

for field, value in (("version", "2.13.0+doctored"), ("git_version", "0" * 40), ("cxx11_abi", "flip")):
    rec = json.loads(good_rec)
    rec["torch"][field] = (not rec["torch"][field]) if value == "flip" else value
    open(rec_path, "w").write(json.dumps(rec))
    attempt(field)
open(rec_path, "w").write(good_rec)
replace(rep.library, good_lib[:4096] + bytes(64) + good_lib[4160:])
attempt("damaged")
os.remove(rep.library)
attempt("missing")
replace(rep.library, good_lib)
open(rec_path, "w").write("{not json")
attempt("record")
open(rec_path, "w").write(good_rec)
print(json.dumps(res))
"""


def test_fresh_venv_without_a_compiler_registers_every_op_from_the_wheel(wheel, tmp_path, default_plan):
    python = _venv(tmp_path / "venv", wheel)
    cache = tmp_path / "cache"  # empty: nothing can come from a cached build
    r = _run(python, NO_COMPILER, str(tmp_path / "venv" / "bin"), cache)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    ok = res["ok"]
    assert sorted(ok["registered"]) == default_plan.ops() and ok["refused"] == {}
    assert ok["library"].startswith(_site(tmp_path / "venv")) and ok["prebuilt"] in os.path.basename(wheel)
    assert ok["versions"] == [1, 1]
    assert not os.path.exists(cache / "builds")  # nothing compiled, nothing built
    for field in ("version", "git_version", "cxx11_abi"):
        code, msg, active = res[field]
        assert code == 2 and active == [] and "\n" not in msg, res[field]
        assert f"was built for another torch build: {field} " in msg and "build=False" in msg, msg
    import torch

    assert f"version '2.13.0+doctored' (this torch: '{torch.__version__}')" in res["version"][1]
    assert "is not the library that was built" in res["damaged"][1] and res["damaged"][2] == []
    assert "No such file or directory" in res["missing"][1] and res["missing"][2] == []
    assert "record.json is missing or damaged" in res["record"][1] and res["record"][2] == []


FALLBACK = """
import json, torchgen_patch
rep = torchgen_patch.install()
print(json.dumps({"n": len(rep.registered), "unused": rep.prebuilt_unused, "prebuilt": rep.prebuilt,
                  "library": rep.library, "summary": rep.summary()}))
"""


def test_another_torch_build_falls_back_to_the_cache_or_is_refused_by_no_build(wheel, tmp_path, default_plan,
                                                                                library):
    python = _venv(tmp_path / "venv", wheel)
    rec_path = os.path.join(_site(tmp_path / "venv"), "torchgen_patch_kernels", "record.json")
    rec = json.load(open(rec_path))
    rec["torch"]["version"] = "2.13.0+doctored"
    json.dump(rec, open(rec_path, "w"))
    cache = tmp_path / "cache"
    shutil.copytree(library.directory, cache / "builds" / os.path.basename(library.directory), symlinks=True)
    r = _run(python, FALLBACK, os.environ["PATH"], cache)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["n"] == len(default_plan.ops()) and res["prebuilt"] is None
    assert res["library"].startswith(str(cache / "builds"))  # the cached build, not compiled again
    assert "version '2.13.0+doctored'" in res["unused"] and "prebuilt kernels not used:" in res["summary"]
    # the CLI, told not to build: one line, exit 2, the reason
    r = _run(python, "import sys; from torchgen_patch.cli import main; sys.exit(main(['install', '--no-build']))",
             os.environ["PATH"], cache)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("torchgen-patch: error: no usable prebuilt kernels: torchgen-patch-kernels ")
    assert "built for another torch build: version '2.13.0+doctored'" in r.stderr
    # and with no compiler on PATH and no cache, the fallback fails naming the same reason (exit 3)
    r = _run(python, "import sys; from torchgen_patch.cli import main; sys.exit(main(['install']))",
             str(tmp_path / "venv" / "bin"), tmp_path / "empty")
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert "no C++ compiler" in r.stderr and "version '2.13.0+doctored'" in r.stderr


def test_two_copies_installed_are_refused_with_the_reason(wheel, tmp_path):
    python = _venv(tmp_path / "venv", wheel)
    other = tmp_path / "other"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(other), wheel], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = _run(python, "import sys; from torchgen_patch.cli import main; sys.exit(main(['install', '--no-build']))",
             str(tmp_path / "venv" / "bin"), tmp_path / "cache", extra_path=str(other))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "2 copies of torchgen-patch-kernels are installed" in r.stderr and "uninstall all but one" in r.stderr


def test_run_patches_a_program_with_the_wheel_and_no_compiler(wheel, tmp_path, default_plan):
    python = _venv(tmp_path / "venv", wheel)
    cache = tmp_path / "cache"
    code = ("import sys; from torchgen_patch.cli import main; sys.exit(main(['run', '--', sys.executable, '-c', "
            "'import torch, torchgen_patch; print(len(torchgen_patch.installed_ops()))']))")
    r = _run(python, code, str(tmp_path / "venv" / "bin"), cache)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(len(default_plan.ops()))
    assert f"{len(default_plan.ops())} kernels active (cpp), 0 refused" in r.stderr
    assert not os.path.exists(cache / "builds")


def _recipe() -> list[str]:
    """The command lines of the cluster recipe in docs/run.md, in order."""
    text = open(os.path.join(ROOT, "docs", "run.md"), encoding="utf-8").read()
    block = text[text.index("<!-- cluster recipe -->"):].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_cluster_recipe_as_written(wheel, tmp_path, default_plan):
    """docs/run.md's recipe, line by line: the tool from `pip wheel`, the kernels wheel, both pip-installed
    in a fresh venv of the same torch with no compiler, then `torchgen-patch run`. Run offline here:
    pip gets --no-index (the venv sees this torch's site-packages, where the dependencies are)."""
    lines = _recipe()
    assert [line.split()[:2] for line in lines] == [["pip", "wheel"], ["torchgen-patch", "wheel"],
                                                   ["pip", "install"], ["torchgen-patch", "run"]]
    work = tmp_path / "clone"
    skip = shutil.ignore_patterns(".venv*", ".cache", ".git", "*.egg-info")

    def ignore(d, names):  # the checkout's own build/ output, not the package's runtime/compile/
        return set(skip(d, names)) | ({"build"} & set(names) if os.path.samefile(d, ROOT) else set())

    shutil.copytree(ROOT, work, ignore=ignore)
    dist = work / "dist"
    dist.mkdir()
    shutil.copy(wheel, dist)  # line 2, `torchgen-patch wheel -o dist`: the module's fixture ran it
    # offline: no index, and setuptools from this environment (pip reads PIP_NO_BUILD_ISOLATION=0 as
    # --no-build-isolation)
    build = subprocess.run(lines[0].replace("pip", f"{sys.executable} -m pip", 1), shell=True, cwd=work,
                           capture_output=True, text=True,
                           env=dict(os.environ, PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0"))
    assert build.returncode == 0, build.stderr[-2000:]
    venv = tmp_path / "node"
    python = _venv(venv, wheel)
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "PYTHONPATH")}
    env.update(PATH=str(venv / "bin") + os.pathsep + "/usr/bin:/bin", PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", TORCHGEN_PATCH_CACHE=str(tmp_path / "cache"))
    pip = f"{sys.executable} -m pip --python {python}"
    r = subprocess.run(lines[2].replace("pip", pip, 1), shell=True, cwd=work, capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (work / "train.py").write_text("import torch, torchgen_patch\nprint(len(torchgen_patch.installed_ops()))\n")
    r = subprocess.run(lines[3].replace("torchrun --nproc-per-node 8", "python"), shell=True, cwd=work,
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str(len(default_plan.ops()))
    assert not os.path.exists(tmp_path / "cache" / "builds")  # nothing compiled on the node


SAVED_NO_COMPILER = """
import json, shutil, torch, torchgen_patch
assert not any(shutil.which(c) for c in ("c++", "g++", "gcc", "cc", "clang++", "ninja"))
w = torch.nn.Parameter(torch.randn(4, 3)); x = torch.randn(2, 4, requires_grad=True)
with torchgen_patch.check_saved("warn") as c:
    loss = (x @ w).sum(); w.data.mul_(2); loss.backward()
from torchgen_patch.saved import native
print(json.dumps({"path": c.path, "findings": len(c.findings), "module": native.loaded()}))
"""


def test_the_wheel_carries_the_checks_native_hooks_which_run_without_a_compiler(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        rec = json.loads(z.read("torchgen_patch_kernels/record.json"))
        assert rec["saved"]["library"] in {os.path.basename(n) for n in z.namelist()}
    python = _venv(tmp_path / "venv", wheel)
    r = _run(python, SAVED_NO_COMPILER, str(tmp_path / "venv" / "bin"), tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"path": "native", "findings": 1, "module": True}
    assert not os.path.exists(tmp_path / "cache" / "builds")  # nothing compiled


SAVED_WHY = """
import json, torch, torchgen_patch
with torchgen_patch.check_saved("warn") as c:
    pass
from torchgen_patch.saved import native
print(json.dumps({"path": c.path, "why": native._STATE["why"]}))
"""


def test_a_refused_prebuilt_copy_of_the_checks_hooks_is_named_with_its_reason(wheel, tmp_path):
    """The wheel's copy of the check's native hooks refused (writable by others, a zeroed SHA-256 in the
    record, a name with ../ in the record) and none can be built (no compiler): the check runs on its
    Python hooks, and its reason names the wheel and why its copy was refused, in one line, as the
    kernels' refusal does. Before, it said only that there is no compiler."""
    python = _venv(tmp_path / "venv", wheel)
    pkg = os.path.join(_site(tmp_path / "venv"), "torchgen_patch_kernels")
    rec_path = os.path.join(pkg, "record.json")
    good = open(rec_path).read()
    rec = json.loads(good)
    lib = os.path.join(pkg, rec["saved"]["library"])
    mode = os.stat(lib).st_mode & 0o7777

    def edited(**saved):
        def edit():
            with open(rec_path, "w") as fh:
                json.dump(dict(rec, saved=dict(rec["saved"], **saved)), fh)
        return edit

    cases = [(lambda: os.chmod(lib, os.stat(lib).st_mode | 0o002), "writable by others"),
             (edited(sha256="0" * 64), "is not the library that was built"),
             (edited(library="../" + rec["saved"]["library"]), "names the library '../torchgen_patch_saved_")]
    for make, said in cases:
        make()
        try:
            r = _run(python, SAVED_WHY, str(tmp_path / "venv" / "bin"), tmp_path / "cache")
        finally:
            os.chmod(lib, mode)
            with open(rec_path, "w") as fh:
                fh.write(good)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["path"] == "python" and "\n" not in got["why"], got
        assert got["why"].startswith("no C++ compiler: ") and "; the installed prebuilt copy was not used: " \
            "torchgen-patch-kernels " in got["why"] and said in got["why"], got


def test_a_failed_pip_wheel_gets_the_hint_that_fits_what_pip_said():
    """The setuptools hint only where pip says setuptools or bdist_wheel is missing (a wheel -q that failed
    under load got it, and it was wrong)."""
    from torchgen_patch.runtime.prebuilt import wheel_hint

    assert "setuptools>=70.1" in wheel_hint("ModuleNotFoundError: No module named 'setuptools'")
    assert "setuptools>=70.1" in wheel_hint("error: invalid command 'bdist_wheel'")
    assert "free space" in wheel_hint("OSError: [Errno 28] No space left on device")
    said = "ERROR: Could not build wheels: subprocess-exited-with-error\nKilled"
    assert "setuptools" not in wheel_hint(said) and "pip's own words" in wheel_hint(said)
