"""Checkout-layout trees: directories shaped like a PyTorch source checkout, assembled from the files a
torch wheel ships (stdlib only; never imports torch or torchgen).

    ROOT/torchgen/        the wheel's torchgen/ minus torchgen/packaged/
    ROOT/tools/autograd/  torchgen/packaged/autograd/   (plus an empty ROOT/tools/__init__.py)
    ROOT/aten/src/ATen/   torchgen/packaged/ATen/
    ROOT/version.txt      the torch version, local part dropped ("2.14.1+cu130" -> "2.14.1")
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import zipfile

# Where each wheel member prefix goes in a tree (first match wins; None = skip).
_LAYOUT: list[tuple[str, str | None]] = [
    ("torchgen/packaged/autograd/", "tools/autograd/"),
    ("torchgen/packaged/ATen/", "aten/src/ATen/"),
    ("torchgen/packaged/", None),
    ("torchgen/", "torchgen/"),
]
_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
WHEEL_DIRS = ["/opt/pypi-more/files", "/opt/pypi/files", "/opt/wheels"]


def _dest(name: str) -> str | None:
    """Tree-relative path for a wheel member (or a path relative to site-packages), None to skip."""
    if "__pycache__/" in name or name.endswith((".pyc", "/")):
        return None
    for prefix, target in _LAYOUT:
        if name.startswith(prefix):
            return None if target is None else target + name[len(prefix):]
    return None


def _version_txt(version: str) -> str:
    return version.split("+")[0].strip() + "\n"


def _finish(root: str, version: str, git: bool) -> str:
    os.makedirs(os.path.join(root, "tools"), exist_ok=True)
    open(os.path.join(root, "tools", "__init__.py"), "w").close()
    with open(os.path.join(root, "version.txt"), "w") as f:
        f.write(_version_txt(version))
    if git:
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "-A"], cwd=root, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree"],
                       cwd=root, check=True)
    return root


def installed_version() -> str:
    """The installed torch's __version__, read from torch/version.py without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise RuntimeError("torch is not installed")
    with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
        m = _VERSION.search(f.read())
    if m is None:
        raise RuntimeError(f"no __version__ in {spec.origin}")
    return m.group(1)


def tree_from_installed(root: str, git: bool = True) -> str:
    """Build a checkout-layout tree at `root` from the installed torchgen/torch; returns root."""
    spec = importlib.util.find_spec("torchgen")
    if spec is None or spec.origin is None:
        raise RuntimeError("torchgen is not installed")
    site = os.path.dirname(os.path.dirname(spec.origin))
    for dirpath, dirnames, filenames in os.walk(os.path.join(site, "torchgen")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in filenames:
            rel = os.path.relpath(os.path.join(dirpath, fn), site).replace(os.sep, "/")
            dest = _dest(rel)
            if dest is not None:
                os.makedirs(os.path.dirname(os.path.join(root, dest)), exist_ok=True)
                shutil.copy2(os.path.join(dirpath, fn), os.path.join(root, dest))
    return _finish(root, installed_version(), git)


def _wheel_version(wheel: str, z: zipfile.ZipFile) -> str:
    """torch.__version__ from the wheel's torch/version.py, else the version in the file name."""
    try:
        m = _VERSION.search(z.read("torch/version.py").decode())
        if m:
            return m.group(1)
    except KeyError:
        pass
    return os.path.basename(wheel).split("-")[1]


def _extract(z: zipfile.ZipFile, name: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with z.open(name) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)


def tree_from_wheel(wheel: str, root: str, git: bool = True) -> str:
    """Build a checkout-layout tree at `root` from a torch wheel (reads only torchgen/ members)."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            dest = _dest(name)
            if dest is not None:
                _extract(z, name, os.path.join(root, dest))
        version = _wheel_version(wheel, z)
    return _finish(root, version, git)


def site_from_wheel(wheel: str, dest: str) -> str:
    """Extract the wheel's complete torchgen/ package (packaged/ included) into dest; returns dest,
    which on PYTHONPATH acts as that release's installed torchgen."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("torchgen/") and not name.endswith("/"):
                _extract(z, name, os.path.join(dest, name))
    return dest


def _find_links() -> list[str]:
    """Local directories named by pip's find-links config (empty on any failure)."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    dirs = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith(".find-links"):
            for item in shlex.split(value.strip().strip("'\"")):
                item = item.removeprefix("file://")
                if os.path.isdir(item) and item not in dirs:
                    dirs.append(item)
    return dirs


def find_torch_wheel(version: str) -> str | None:
    """A torch wheel for `version` and this interpreter: $TORCHGEN_PATCH_TORCH_WHEEL_<2_14_1> if it
    names a file, else a glob in WHEEL_DIRS and pip's find-links dirs; None if not found."""
    env = os.environ.get("TORCHGEN_PATCH_TORCH_WHEEL_" + version.replace(".", "_"))
    if env and os.path.isfile(env):
        return env
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = platform.machine()
    for d in WHEEL_DIRS + _find_links():
        # exact version first, then local variants such as 2.13.0+cpu
        for v in (version, version + "+*"):
            pattern = f"torch-{v}-{tag}-{tag}-*{machine}.whl"
            hits = sorted(glob.glob(os.path.join(d, pattern)))
            if hits:
                return hits[0]
    return None
