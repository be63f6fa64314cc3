"""The wheel carries what an installed tool needs: the templates and the
shipped overlay, found without the source tree."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    d = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", ROOT, "-w", str(d / "whl")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip().splitlines()[-1:]}")
    (d / "build.log").write_text(r.stdout + r.stderr)
    wheel = next((d / "whl").iterdir())
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(d / "site"),
                        str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return d


def test_installed_wheel_generates_the_same_files(installed, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(installed / "site"), TORCHGEN_PATCH_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "gen", "--strict", "--out", str(tmp_path / "a")],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "3 left out" in r.stdout  # the shipped overlay was found and applied (gen's summary line)
    r = subprocess.run([sys.executable, "-c", "import torchgen_patch, sys; print(torchgen_patch.__file__)"],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.stdout.startswith(str(installed / "site"))
    src = subprocess.run([sys.executable, "-m", "torchgen_patch", "gen", "--strict", "--out", str(tmp_path / "b")],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert src.returncode == 0
    for name in os.listdir(tmp_path / "b"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_wheel_builds_without_setuptools_warnings(installed):
    log = (installed / "build.log").read_text()
    assert "Successfully built" in log or "Saved" in log, log[-2000:]
    assert "would be ignored" not in log and "Warning" not in log, log[-3000:]


def test_the_installed_wheel_ships_the_cmake_module_and_says_where(installed, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(installed / "site"))
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "--cmake-dir"], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path))
    assert (r.returncode, r.stderr) == (0, "")
    d = r.stdout.strip()
    assert d == str(installed / "site" / "torchgen_patch" / "cmake")
    assert os.path.isfile(os.path.join(d, "TorchgenPatch.cmake"))
    # the module makes the build depend on the templates at ../templates from its own folder
    assert any(n.endswith(".j2") for n in os.listdir(os.path.join(d, "..", "templates")))


def test_the_installed_wheel_carries_every_native_source(installed):
    """The plain C++ and CUDA of templates/saved/ and templates/statement/ (package data in folders of their own)
    are in the wheel, byte for byte: the templates' folder it reads is the source tree's."""
    show = ("import hashlib, importlib, json\n"
            "render = importlib.import_module('torchgen_patch.codegen.render')\n"
            "print(render.templates_dir())\n"
            "print(json.dumps({n: hashlib.sha256(d).hexdigest() for n, d in render.template_files().items()}))\n")
    runs = [subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, cwd=cwd,
                           env=dict(os.environ, PYTHONPATH=path)) for path, cwd in ((str(installed / "site"), "/"),
                                                                                    (ROOT, ROOT))]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    (wheel_dir, wheel_files), (tree_dir, tree_files) = [r.stdout.splitlines() for r in runs]
    assert wheel_dir.startswith(str(installed / "site")) and tree_dir == os.path.join(ROOT, "templates")
    assert wheel_files == tree_files
    assert '"saved/fingerprint.cu"' in wheel_files and '"statement/torchgen_patch_build.cpp"' in wheel_files


def test_the_wheel_requires_ninja_for_the_default_backend(installed):
    meta = next((installed / "site").glob("torchgen_patch-*.dist-info")) / "METADATA"
    assert "Requires-Dist: ninja" in meta.read_text().splitlines()


def test_the_folders_the_readme_writes_are_ignored_by_git():
    """`pip wheel -w dist/ .` and `torchgen-patch wheel -o dist/` (the README's cluster path) and
    `make run`'s build/ leave nothing for `git status` to show."""
    if not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    paths = ["dist/torchgen_patch-0.1.0-py3-none-any.whl", "build/lint.txt"]
    r = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.split() == paths, r.stdout + r.stderr
