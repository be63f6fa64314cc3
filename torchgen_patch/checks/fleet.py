"""``torchgen-patch findings DIR``: the saved-tensor check's findings of a fleet (every process of a job
writes its own file, ``saved/fleet.py``), read back and grouped by site: the op that saved the tensor and
the forward call that ran it. Each site says how many findings, processes, hosts, ranks and steps found
it, which tensors, where backward used them, and who most likely wrote them.

Everything in the folder is input, whoever wrote it: each ``*.jsonl`` a regular file of bounded size
(``fs.appends.read_folder``), each line a ``Record`` checked field by field (``Record.parse``). A file
or a line that is not one (a symlink, a FIFO, a line cut short by a full disk or a crash, garbage)
becomes a ``Problem`` (``FILE:LINE: error: ...``) and is skipped; the rest still counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..errors import InputError
from ..saved.finding import Finding, Frame
from ..saved.fleet import SUFFIX, Record

LIMIT = 64 << 20  # the largest file read (a process writes at most fleet.MAX_LINES lines, a few MB)


@dataclass(frozen=True)
class Problem:
    """A file or a line of the folder that was skipped, and why."""

    path: str
    line: int | None
    message: str

    def render(self) -> str:
        return InputError(self.path, self.line, self.message).render()


@dataclass(frozen=True)
class Site:
    """The findings of one site (``node``, ``forward``) across the fleet."""

    node: str | None  # the autograd node that saved the tensor ("AddmmBackward0")
    forward: Frame | None  # the program's frame of the forward call that ran it
    findings: int
    processes: int  # distinct processes (one file each)
    hosts: tuple[str, ...]
    ranks: tuple[int, ...]
    steps: int  # distinct steps (backward passes, per process counted from 0)
    first_step: int | None
    last_step: int | None
    tensors: tuple[Finding, ...]  # one finding per distinct tensor saved there
    backward: tuple[Frame, ...]  # the backward calls that used it
    likely: Finding  # a finding with the most common list of likely writers (its writers, its optimizer)


@dataclass(frozen=True)
class Report:
    """The folder's findings, grouped: sites by how many processes found them, then by name and line."""

    sites: tuple[Site, ...]
    findings: int
    processes: int
    hosts: tuple[str, ...]
    ranks: tuple[int, ...]
    files: int  # files read
    problems: tuple[Problem, ...]  # what was skipped


def _frame_key(fr: Frame | None) -> tuple:
    return ("", 0, "") if fr is None else (fr.file, fr.line, fr.function)


def _tensor_key(f: Finding) -> tuple:
    return (f.name or "", f.owner or "", f.view, f.shape, f.dtype, f.device)


def _order(entry: tuple[str, Record]) -> tuple:
    """Records in a fixed order whatever the files' order: by step, host, pid, file."""
    file, r = entry
    return (-1 if r.step is None else r.step, r.host, r.pid, file, r.finding.rank if r.finding.rank is not None else -1)


def read(path: str, note=None) -> tuple[list[tuple[str, Record]], list[Problem], int]:
    """(every record of the folder ``path``, with the name of its file; what was skipped; files read).
    An InputError when ``path`` is no directory that can be read. ``note``: called with a line for
    each file read (-v)."""
    import os

    from ..fs.appends import read_folder

    records: list[tuple[str, Record]] = []
    problems: list[Problem] = []
    files = 0
    for entry in read_folder(path, SUFFIX, LIMIT):
        where = os.path.join(path, entry.name)
        if entry.problem:
            problems.append(Problem(where, None, entry.problem))
            continue
        files += 1
        lines = entry.data.split(b"\n")
        cut = lines.pop()  # b"" after the last newline; else a line written in part
        if cut.strip():
            problems.append(Problem(where, len(lines) + 1, "a line cut short (no newline at its end): skipped"))
        before = len(records)
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append((entry.name, Record.parse(line)))
            except ValueError as e:
                problems.append(Problem(where, n, f"not a findings line: {e}: skipped"))
        if note is not None:
            note(f"{where}: {len(records) - before} findings")
    return records, problems, files


def group(records: list[tuple[str, Record]], problems: list[Problem], files: int) -> Report:
    """The records grouped by site (the node that saved the tensor, the forward call)."""
    by_site: dict[tuple, list[tuple[str, Record]]] = {}
    for entry in sorted(records, key=_order):
        f = entry[1].finding
        by_site.setdefault((f.node or "", _frame_key(f.forward)), []).append(entry)
    sites = sorted((_site(entries) for entries in by_site.values()),
                   key=lambda s: (-s.processes, -s.findings, s.node or "", _frame_key(s.forward)))
    return Report(sites=tuple(sites), findings=len(records), processes=len({_process(e) for e in records}),
                  hosts=tuple(sorted({r.host for _, r in records})),
                  ranks=tuple(sorted({r.finding.rank for _, r in records if r.finding.rank is not None})),
                  files=files, problems=tuple(problems))


def _process(entry: tuple[str, Record]) -> tuple:
    file, r = entry
    return (file, r.host, r.pid)


def _site(entries: list[tuple[str, Record]]) -> Site:
    """One site's findings (in ``_order``) summed up."""
    fs = [r.finding for _, r in entries]
    distinct = sorted({r.step for _, r in entries if r.step is not None})
    tensors: dict[tuple, Finding] = {}
    for f in fs:
        tensors.setdefault(_tensor_key(f), f)
    writers = Counter(_writer(f) for f in fs)
    top = max(writers.values())
    most = min(k for k, n in writers.items() if n == top)
    return Site(node=fs[0].node, forward=fs[0].forward, findings=len(fs),
                processes=len({_process(e) for e in entries}), hosts=tuple(sorted({r.host for _, r in entries})),
                ranks=tuple(sorted({f.rank for f in fs if f.rank is not None})), steps=len(distinct),
                first_step=distinct[0] if distinct else None, last_step=distinct[-1] if distinct else None,
                tensors=tuple(tensors[k] for k in sorted(tensors)),
                backward=tuple(sorted({f.backward for f in fs if f.backward is not None})),
                likely=next(f for f in fs if _writer(f) == most))


def _writer(f: Finding) -> tuple:
    """Who a finding says wrote its tensor: its writers, the optimizer and the Triton kernel it names."""
    return (f.writers, f.optimizer or "", f.kernel or "", f.launch.render() if f.launch else "")


def report(path: str, note=None) -> Report:
    """The folder ``path``'s findings, read and grouped (``note``: as ``read``'s)."""
    return group(*read(path, note))
