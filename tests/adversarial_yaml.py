"""Hostile yaml as a pull request could bring it to a CI lint: each case is a file (or a special
file) and the command that reads it. ``run_bounded`` runs one case in a fresh interpreter under
an address-space limit and a timeout, and says how it ended."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from tests.conftest import ROOT

# every field torchgen's NativeFunction.from_yaml reads (torchgen/model.py: e.pop(...))
NATIVE_FIELDS = ("func", "variants", "dispatch", "tags", "structured", "structured_delegate", "structured_inherits",
                 "python_module", "category_override", "device_check", "device_guard", "manual_kernel_registration",
                 "manual_cpp_binding", "cpp_no_default_args", "precomputed", "autogen", "ufunc_inner_loop")
TAGS_FIELDS = ("tag", "desc")
OVERLAY_FIELDS = ("action", "reason", "template")
OK_ENTRY = "- func: tp_ok(Tensor(a!) self) -> ()\n  variants: function\n"  # one op, a missing one


def laughs(levels: int = 9, width: int = 10) -> str:
    """A flow list whose last element expands to width**levels scalars, all by alias."""
    items = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        items.append(f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "[" + ", ".join(items) + "]"


def laughs_map(levels: int = 9, width: int = 10) -> str:
    """The same, as nested mappings (for fields torchgen reads as a dict)."""
    items = ["k0: &m0 {" + ", ".join(f"x{j}: lol" for j in range(width)) + "}"]
    for i in range(1, levels):
        items.append(f"k{i}: &m{i} {{" + ", ".join(f"x{j}: *m{i - 1}" for j in range(width)) + "}")
    return "{" + ", ".join(items) + "}"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # native | tags | overlay | baseline
    content: bytes | None  # None: a special file made by ``special``
    special: str | None = None  # devzero | fifo


def _native(name: str, text: str) -> Case:
    return Case(name, "native", text.encode())


def cases() -> list[Case]:
    out = []
    for f in NATIVE_FIELDS:
        head = "" if f == "func" else "- func: tp_a(Tensor(a!) self) -> ()\n"
        body = f"  {f}: {laughs()}\n" if f != "func" else f"- func: {laughs()}\n"
        out.append(_native(f"laughs-list-{f}", OK_ENTRY + head + body))
        if f != "func":
            out.append(_native(f"laughs-map-{f}", OK_ENTRY + head + f"  {f}: {laughs_map()}\n"))
    out.append(_native("laughs-unknown-field",
                       OK_ENTRY + f"- func: tp_a(Tensor self) -> Tensor\n  extra: {laughs()}\n"))
    out.append(_native("laughs-merge-key", OK_ENTRY + f"- func: tp_a(Tensor self) -> Tensor\n  <<: {laughs_map()}\n"))
    out.append(_native("laughs-whole-entry", f"- &e {{func: 'tp_e(Tensor self) -> Tensor', x: {laughs()}}}\n"
                                             + "".join("- *e\n" for _ in range(50))))
    for f in TAGS_FIELDS:
        entry = {"tag": "t3", "desc": "d", f: laughs()}
        out.append(Case(f"laughs-tags-{f}", "tags", ("- tag: pointwise\n  desc: d\n- tag: t2\n  desc: d\n"
                                                     f"- tag: {entry['tag']}\n  desc: {entry['desc']}\n").encode()))
    for f in OVERLAY_FIELDS:
        out.append(Case(f"laughs-overlay-{f}", "overlay", f"aten::tp_ok:\n  {f}: {laughs()}\n".encode()))
    out.append(Case("laughs-overlay-key", "overlay", f"? {laughs()}\n: {{action: skip, reason: x}}\n".encode()))
    depth = 200_000
    out.append(_native("nested-flow-lists", "- func: " + "[" * depth + "]" * depth + "\n"))
    out.append(_native("nested-flow-maps", "- func: " + "{a: " * depth + "x" + "}" * depth + "\n"))
    out.append(_native("nested-block-maps", "- func: tp_a(Tensor self) -> Tensor\n  dispatch:\n"
                       + "".join(" " * (4 + 2 * i) + f"k{i}:\n" for i in range(5000)) + " " * 10006 + "x\n"))
    out.append(Case("nested-overlay", "overlay", ("aten::x: " + "[" * depth + "]" * depth + "\n").encode()))
    out.append(Case("nested-overlay-small", "overlay", ("aten::x: " + "[" * 5000 + "]" * 5000 + "\n").encode()))
    out.append(_native("long-line-schema", "- func: tp_long(" + ", ".join(f"Tensor a{i}" for i in range(300_000))
                       + ") -> Tensor\n"))
    out.append(_native("long-line-comment", OK_ENTRY + "# " + "x" * 8_000_000 + "\n"))
    out.append(_native("long-line-scalar", OK_ENTRY + "- func: tp_b(Tensor self) -> Tensor\n  python_module: "
                       + "m" * 8_000_000 + "\n"))
    out.append(_native("many-entries", "".join(f"- func: tp_{i}(Tensor(a!) self) -> ()\n" for i in range(30_000))))
    out.append(_native("many-keys-in-one-entry", "- func: tp_a(Tensor self) -> Tensor\n"
                       + "".join(f"  k{i}: v\n" for i in range(60_000))))
    out.append(_native("many-dispatch-keys", "- func: tp_a(Tensor self) -> Tensor\n  dispatch:\n"
                       + "".join(f"    K{i}: k\n" for i in range(60_000))))
    out.append(Case("many-overlay-entries", "overlay", "".join(f"aten::tp_{i}:\n  action: skip\n  reason: r\n"
                                                               for i in range(30_000)).encode()))
    for tag in ("!!python/object/apply:os.system ['touch PWNED']", "!!python/name:os.system",
                "!!python/object/new:os.system [touch PWNED]", "!!binary aGVsbG8="):
        out.append(_native(f"tag-{tag.split()[0][2:].replace('/', '-')}", OK_ENTRY + f"- func: {tag}\n"))
        out.append(Case(f"overlay-tag-{tag.split()[0][2:].replace('/', '-')}", "overlay",
                        f"aten::tp_ok:\n  action: skip\n  reason: {tag}\n".encode()))
    out.append(Case("tags-python-tag", "tags", b"- tag: !!python/object/apply:os.system ['touch PWNED']\n  desc: d\n"))
    out.append(Case("invalid-utf8", "native", OK_ENTRY.encode() + b"- func: tp_\xff\xfe(Tensor self) -> Tensor\n"))
    out.append(Case("invalid-utf8-overlay", "overlay", b"aten::tp_ok:\n  reason: \xc3\x28\n"))
    out.append(Case("utf16-bom", "native", "\ufeff".encode("utf-16-le") + OK_ENTRY.encode("utf-16-le")))
    out.append(Case("nul-bytes", "native", OK_ENTRY.encode() + b"- func: tp_\x00(Tensor self) -> Tensor\n"))
    out.append(Case("nested-baseline", "baseline", b'{"version": 1, "accepted": ' + b"[" * depth + b"]" * depth
                    + b"}"))
    out.append(Case("long-baseline", "baseline", b'{"version": 1, "accepted": [' + b'"x", ' * 2_000_000 + b'"x"]}'))
    for special in ("devzero", "fifo"):
        for kind in ("native", "tags", "overlay", "baseline"):
            out.append(Case(f"{special}-{kind}", kind, None, special))
    return out


def materialize(case: Case, d: str, tags: str) -> str:
    """Write ``case`` into ``d`` (a native_functions.yaml gets a copy of ``tags`` beside it)."""
    import shutil

    if case.kind == "native":
        shutil.copy(tags, os.path.join(d, "tags.yaml"))
    path = os.path.join(d, "hostile.yaml")
    if case.special == "devzero":
        os.symlink("/dev/zero", path)
    elif case.special == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as fh:
            fh.write(case.content)
    return path


def command(case: Case | None, path: str, tags: str) -> list[str]:
    """The lint the way CI runs it on a pull request's files (no result cache: every case parses).
    The hostile file is the only one of its kind; the others are a one-entry yaml and ``tags``.
    ``case`` None: the plain one-entry yaml ``path`` (the anchor of the time bound)."""
    d = os.path.dirname(path)
    if case is None or case.kind == "native":
        return ["lint", "--no-cache", "--format", "json", "--native-functions", path, "--tags",
                os.path.join(d, "tags.yaml") if case else tags]
    small = os.path.join(d, "native_functions.yaml")
    with open(small, "w") as fh:
        fh.write(OK_ENTRY)
    flag = {"tags": "--tags", "overlay": "--overlay", "baseline": "--baseline"}[case.kind]
    argv = ["lint", "--no-cache", "--format", "json", "--native-functions", small, flag, path]
    return argv if case.kind == "tags" else argv + ["--tags", tags]


@dataclass
class Outcome:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


def _limit(memory: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_bounded(argv: list[str], cwd: str, timeout: float, memory: int = 500 << 20) -> Outcome:
    env = dict(os.environ, PYTHONPATH=ROOT)
    t = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "torchgen_patch", *argv], cwd=cwd, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_limit(memory))
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        rc = None
    return Outcome(rc, out, err, time.monotonic() - t)
