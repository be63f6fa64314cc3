"""A py-spy dump of a stuck rank (``py-spy dump --native --locals``) read as what it is: threads of
frames, each frame a function and the file or library it is in, with the arguments py-spy printed
under it. What a dump shows is judged on frames only, never on its text: the values of arguments and
locals are text that may name any function. py-spy writes each value on one line of its own, indented
under its frame, with its newlines escaped, so no value reads as a frame.

    read_stuck(dump)       -> the test the rank runs, whether its threads show torch 2.6's gloo teardown
                              deadlock, whether a frame of this project is on any of them
    deadlock_excerpt(dump) -> the deadlock's two threads, frame by frame, for the report
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OURS = "torchgen_patch"  # in every library, module and path of this project's
COMMON_DISTRIBUTED = "torch/testing/_internal/common_distributed.py"
# a frame line: four spaces, an address py-spy may print first, the function, then (file:line) or (library)
_FRAME = re.compile(r"    (?:0x[0-9a-f]+ ?)?(?P<function>.*?) ?\((?P<where>[^()]*)\)")
_LIBRARY = re.compile(r"[^/]*\.so(?:\.[\w.]*)?")


@dataclass(frozen=True)
class Frame:
    function: str  # "" for a native frame py-spy could not name (an address only)
    file: str  # a Python file (shortened as py-spy shows it) or a shared library's file name
    text: str  # the frame's line as py-spy wrote it, stripped
    arguments: tuple[tuple[str, str], ...] = ()  # (name, value as py-spy wrote it) under "Arguments:"

    def is_(self, function: str, library: str | None = None) -> bool:
        """This frame is ``function`` in a shared library (whose file name starts with ``library``, when
        given)."""
        return (self.function == function and bool(_LIBRARY.fullmatch(self.file))
                and (library is None or self.file.startswith(library)))

    def argument(self, name: str) -> str | None:
        return next((v for n, v in self.arguments if n == name), None)


@dataclass(frozen=True)
class Thread:
    header: str
    frames: tuple[Frame, ...]  # innermost first, as py-spy lists them


def thread_texts(dump: str) -> list[str]:
    """A py-spy dump's threads, each its own text."""
    return ["Thread " + t for t in re.split(r"^Thread ", dump, flags=re.M)[1:]]


def threads(dump: str) -> list[Thread]:
    return [_thread(t) for t in thread_texts(dump)]


def _thread(text: str) -> Thread:
    lines = text.split("\n")  # only py-spy's own line ends: a value's escaped newline is no line
    frames: list[Frame] = []
    args: list[tuple[str, str]] = []
    section = None
    for line in lines[1:]:
        if line.startswith("    ") and not line.startswith("     "):
            if frames and args:
                frames[-1] = Frame(frames[-1].function, frames[-1].file, frames[-1].text, tuple(args))
            args, section = [], None
            m = _FRAME.fullmatch(line)
            if m:
                where = m.group("where")
                file = re.sub(r":\d+$", "", where)
                frames.append(Frame(m.group("function").strip(), file, line.strip()))
        elif line.startswith("        ") and not line.startswith("         "):
            section = line.strip()  # "Arguments:" or "Locals:"
        elif line.startswith("            ") and section == "Arguments:" and frames:
            name, _, value = line.strip().partition(": ")
            args.append((name, value))
    if frames and args:
        frames[-1] = Frame(frames[-1].function, frames[-1].file, frames[-1].text, tuple(args))
    return Thread(lines[0], tuple(frames))


def _calls(thread: Thread, inner: tuple[str, str | None], outer: tuple[str, str | None]) -> bool:
    """A frame ``outer`` on the thread with a frame ``inner`` above it (called from it)."""
    return any(f.is_(*outer) and any(g.is_(*inner) for g in thread.frames[:i]) for i, f in enumerate(thread.frames))


def joins_workers(thread: Thread) -> bool:
    """The deadlock's first thread: ~ProcessGroupGloo joining gloo's workers (the GIL held)."""
    return _calls(thread, ("std::thread::join", None), ("c10d::ProcessGroupGloo::~ProcessGroupGloo", "libtorch_cpu.so"))


def waits_for_gil(thread: Thread) -> bool:
    """The deadlock's second thread: a gloo worker waiting for the GIL."""
    return _calls(thread, ("pybind11::gil_scoped_acquire::gil_scoped_acquire", "libtorch_python.so"),
                  ("c10d::ProcessGroupGloo::runLoop", "libtorch_cpu.so"))


def run_test_of(thread: Thread) -> str | None:
    """Class.name of the test a thread runs: the ``self`` and ``test_name`` arguments py-spy --locals
    prints under PyTorch's MultiProcessTestCase.run_test frame."""
    for f in thread.frames:
        if f.function == "MultiProcessTestCase.run_test" and f.file.endswith(COMMON_DISTRIBUTED):
            cls = re.fullmatch(r"<(\w+) at 0x[0-9a-f]+>", f.argument("self") or "")
            name = re.fullmatch(r'"(\w+)"', f.argument("test_name") or "")
            return f"{cls.group(1)}.{name.group(1)}" if cls and name else None
    return None


def ours(thread: Thread) -> bool:
    """A frame of this project's on the thread: its kernels' or boxed kernel's library, its Python code."""
    return any(OURS in f.function or OURS in f.file for f in thread.frames)


def read_stuck(dump: str) -> dict:
    """What a py-spy dump of a stuck rank shows, from its frames: the test it runs (Class.name, from
    run_test's arguments), whether its threads show torch 2.6's gloo teardown deadlock, and whether a
    frame of this project (its kernels or boxed-kernel libraries, its Python code) is on any of them."""
    ts = threads(dump)
    test = next((t for t in map(run_test_of, ts) if t), None)
    joins, waits = (any(side(t) for t in ts) for side in (joins_workers, waits_for_gil))
    return {"test": test, "gloo_teardown_deadlock": joins and waits, "ours": any(map(ours, ts))}


def deadlock_excerpt(dump: str) -> str:
    """The two threads of the gloo teardown deadlock in a dump, each frame by its function and library or
    file only (no pids, addresses or locals): the evidence the report shows."""
    keep = []
    for t in threads(dump):
        if joins_workers(t) or waits_for_gil(t):
            keep.append(re.sub(r"^Thread \d+ ", "Thread ", t.header))
            keep += ["    " + short_frame(f.text) for f in t.frames]
    return "\n".join(keep)


def short_frame(frame: str) -> str:
    """A frame without its address, a native one with its template arguments folded to <…>."""
    frame = re.sub(r"^0x[0-9a-f]+ ", "", frame)
    if re.search(r"\(lib[^()]*\.so[^()]*\)$", frame):
        while re.search(r"<[^<>]*>", frame):
            frame = re.sub(r"<[^<>]*>", "\x01", frame)
        frame = frame.replace("\x01", "<…>")
    return frame
