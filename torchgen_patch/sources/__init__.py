"""Sources: every input of a run, resolved once and said explicitly.

Two worlds:
- *installed* (default): the imported torch's torchgen, its packaged
  native_functions.yaml / tags.yaml and ``torchgen.packaged.autograd``;
- *checkout* (``pytorch_root``): a PyTorch source checkout's own ``torchgen/``,
  ``tools/autograd/`` and ``aten/src/ATen/native/*.yaml``, imported in
  isolation (see ``sources.torchgen``); no torch needed.
``native_functions``/``tags`` override the yaml in the installed world.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass

from ..errors import InputError, ToolError
from .toolchain import CHECKOUT, INSTALLED, Toolchain, checkout, installed

YAML_DIR = os.path.join("aten", "src", "ATen", "native")


@dataclass(frozen=True)
class Options:
    """What the user asked for (the CLI's flags, the Python API's arguments)."""

    native_functions: str | None = None
    tags: str | None = None
    pytorch_root: str | None = None
    overlay: str | None = None
    no_overlay: bool = False
    no_cache: bool = False
    requires_grad_check: bool = True  # out= kernels refuse requires_grad as PyTorch's own out= kernels do


@dataclass(frozen=True)
class Sources:
    world: str  # installed | checkout
    root: str | None  # the checkout (checkout world)
    native: str
    tags: str
    overlay: str | None  # None: no overlay
    overlay_shipped: bool  # the overlay that comes with the tool (entries for other yamls are dropped)
    toolchain: Toolchain
    torch_version: str  # the installed torch's, or the checkout's version.txt
    tags_packaged: bool = False  # no tags.yaml beside the yaml: torchgen's packaged one is used

    def describe(self) -> dict[str, str | None]:
        """Where each input comes from and what it is (sha256 of its content; for the torchgen
        and autograd codegen pair, of their files): the scan's JSON report carries it."""
        import hashlib

        def sha(path: str | None) -> str | None:
            try:
                with open(path, "rb") as fh:  # type: ignore[arg-type]  # None: the TypeError below
                    return hashlib.sha256(fh.read()).hexdigest()
            except (OSError, TypeError):
                return None

        return {"world": self.world, "root": self.root, "torch_version": self.torch_version,
                "native_functions": self.native, "native_functions_sha256": sha(self.native),
                "tags": self.tags, "tags_sha256": sha(self.tags),
                "overlay": self.overlay, "overlay_sha256": sha(self.overlay),
                "torchgen": self.toolchain.torchgen_dir, "autograd_codegen": self.toolchain.autograd_dir,
                "toolchain_sha256": self.toolchain.identity()}


def overlay_path(opts: Options) -> str | None:
    """The overlay these options ask for: theirs, none, or the shipped one."""
    if opts.overlay is not None and opts.no_overlay:
        raise InputError(None, None, "--overlay and --no-overlay exclude each other")
    return None if opts.no_overlay else (opts.overlay or shipped_overlay())


def resolve(opts: Options) -> Sources:
    overlay = overlay_path(opts)
    shipped = opts.overlay is None and overlay is not None
    if opts.pytorch_root is not None:
        if opts.native_functions or opts.tags:
            raise InputError(None, None, "--pytorch-root excludes --native-functions/--tags",
                             "the checkout's own aten/src/ATen/native/*.yaml are read")
        root = os.path.abspath(os.path.expanduser(opts.pytorch_root))
        if not os.path.isdir(root):
            raise InputError(opts.pytorch_root, None, "--pytorch-root is not a directory")
        d = os.path.join(root, YAML_DIR)
        native, tags = os.path.join(d, "native_functions.yaml"), os.path.join(d, "tags.yaml")
        for p in (native, tags):
            if not os.path.isfile(p):
                raise InputError(opts.pytorch_root, None,
                                 f"not a PyTorch checkout: {os.path.relpath(p, root)} is missing",
                                 "is the checkout complete?")
        tc = checkout(root)
        return Sources(CHECKOUT, root, native, tags, overlay, shipped, tc, _checkout_version(root))
    if opts.native_functions is None and opts.tags is not None:
        raise InputError(None, None, "--tags needs --native-functions")
    tc = installed()
    if opts.native_functions is None:
        d = os.path.join(tc.torchgen_dir, "packaged", "ATen", "native")
        native, tags = os.path.join(d, "native_functions.yaml"), os.path.join(d, "tags.yaml")
    else:
        native = opts.native_functions
        if os.path.isfile(native) and not native.endswith((".yaml", ".yml")):
            raise InputError(native, None, "not a native_functions.yaml: expected a .yaml file, a YAML list of "
                                           "`- func:` entries", "lint the aten/src/ATen/native/native_functions.yaml "
                                                                "of a checkout, or an extension's own")
        tags = opts.tags or os.path.join(os.path.dirname(native), "tags.yaml")
        packaged = os.path.join(tc.torchgen_dir, "packaged", "ATen", "native", "tags.yaml")
        if opts.tags is None and not os.path.exists(tags) and os.path.isfile(native) and os.path.isfile(packaged):
            # how lintrunner and pre-commit call the tool: a yaml path alone; its tags are torchgen's own
            return Sources(INSTALLED, None, native, packaged, overlay, shipped, tc, installed_torch_version(), True)
    return Sources(INSTALLED, None, native, tags, overlay, shipped, tc, installed_torch_version())


def input_paths(opts: Options) -> list[str]:
    """Every file and directory a run with these options reads (found without importing
    torchgen), so that no output can be written over one of them."""
    out = [opts.native_functions, opts.tags]
    if opts.native_functions and not opts.tags:
        out.append(os.path.join(os.path.dirname(opts.native_functions), "tags.yaml"))
    try:
        out.append(overlay_path(opts))
    except ToolError:
        pass  # resolve() says so, in its own words
    if opts.pytorch_root:
        root = os.path.abspath(os.path.expanduser(opts.pytorch_root))
        dirs = [os.path.join(root, YAML_DIR), os.path.join(root, "torchgen"), os.path.join(root, "tools", "autograd")]
        out += dirs + [os.path.join(d, "native_functions.yaml") for d in dirs[:1]] + \
            [os.path.join(d, "tags.yaml") for d in dirs[:1]]
        try:  # the codegen's own files by name too, so that a hard link to one is caught
            out += [os.path.join(dirs[2], n) for n in os.listdir(dirs[2])]
        except OSError:
            pass
    elif not opts.native_functions:
        spec = importlib.util.find_spec("torchgen")  # finds the package without importing it
        if spec is not None and spec.origin:
            packaged = os.path.join(os.path.dirname(spec.origin), "packaged")
            native = os.path.join(packaged, "ATen", "native")
            out += [os.path.join(native, "native_functions.yaml"), os.path.join(native, "tags.yaml"), packaged]
    return [p for p in out if p]


def installed_torch_version() -> str:
    """The installed torch's version, without importing torch (torch/version.py;
    importlib.metadata as a fallback); "none" when no torch is installed."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py"), encoding="utf-8") as fh:
                m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", fh.read(), re.M)
            if m:
                return m.group(1)
        except OSError:
            pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def _checkout_version(root: str) -> str:
    try:
        with open(os.path.join(root, "version.txt"), encoding="utf-8") as fh:
            return fh.read().strip() or "unknown"
    except OSError:
        return "unknown"


def shipped_overlay() -> str | None:
    """The overlay shipped with the tool: at the top of a source tree (or
    editable install), else the copy a wheel installs inside the package."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in (os.path.dirname(pkg), os.path.join(pkg, "shipped")):
        p = os.path.join(d, "native_functions_overlay.yaml")
        if os.path.isfile(p):
            return p
    return None
