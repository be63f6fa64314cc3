"""The saved-tensor check's one value: a ``Finding`` (a tensor autograd saved whose contents
changed between save and use while its version did not), and the exception that carries one."""

from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary import Writer


@dataclass(frozen=True, order=True)
class Frame:
    """A place in the program: file (relative to the working directory when under it), line, function."""

    file: str
    line: int
    function: str

    def render(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Finding:
    """One saved tensor written behind autograd's back."""

    shape: tuple[int, ...]
    dtype: str  # "float32"
    device: str  # "cpu", "cuda:0"
    version: int  # the version it kept
    name: str | None = None  # module path of the parameter or buffer it is (or a view of), if one
    owner: str | None = None  # the class of the outermost module that holds it
    view: bool = False  # a view of ``name`` rather than the tensor itself
    node: str | None = None  # the autograd node that saved it ("MmBackward0")
    forward: Frame | None = None  # the program's own frame of the forward call that saved it
    site: Frame | None = None  # the innermost frame outside torch there, when it is not ``forward``
    call: Frame | None = None  # the program's frame that called its model there, when it is not ``forward``
    backward: Frame | None = None  # the program's own frame of the backward call that used it
    writers: tuple[Writer, ...] = ()  # who may have written it, most likely first
    optimizer: str | None = None  # the optimizer class whose step ran between save and use
    step: Frame | None = None  # the program's frame of that step() call, where the optimizer holds the tensor
    kernel: str | None = None  # a Triton kernel launched between save and use with a pointer into its storage
    launch: Frame | None = None  # the program's frame that launched that kernel
    rank: int | None = None  # the rank, in a multi-rank job

    def key(self) -> tuple:
        """What makes two findings the same one (a loop that repeats a write gives one line)."""
        return (self.name, self.owner, self.view, self.shape, self.dtype, self.device, self.node, self.forward,
                self.call, self.backward, self.rank)


class SavedTensorChanged(RuntimeError):
    """A saved tensor's contents changed while its version did not (``check_saved(mode="raise")``);
    ``text`` is ``render.message(finding)``."""

    def __init__(self, finding: Finding, text: str):
        self.finding = finding
        super().__init__(text)
