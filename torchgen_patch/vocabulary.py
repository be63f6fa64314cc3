"""The project's vocabulary as types: each word that scan, plan, checks and the renderers share
is a member of one enum here. Members are ``str`` and print, compare, hash and serialize as
today's strings (``Verdict.MISSING == "missing"``, ``json.dumps`` writes ``"missing"``), so JSON
and text outputs are unchanged; a new kind of op is a new member, found by every ``in Enum``.
``plural`` is how the messages count them: "1 kernel", "2 kernels"."""

from __future__ import annotations

import enum


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, counted: "1 kernel", "2 kernels"; ``many``: a plural that is not ``word``
    + "s" ("entry", "entries"). The one rule by which the package's messages count things."""
    return f"{n} {word if n == 1 else many or word + 's'}"


class Word(str, enum.Enum):
    """A word of the vocabulary: a ``str`` whose text is its value everywhere."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)

    def __repr__(self) -> str:  # argparse quotes choices with repr(): 'cpp', as before
        return str.__repr__(str.__str__(self))

    @classmethod
    def parse(cls, text):
        """The member spelled ``text`` (what a cache or a launch spec holds); ValueError for any other
        value. One dict look-up: a cached scan reads thousands of words, and ``cls(text)`` costs ten."""
        try:
            return cls._value2member_map_[text]
        except (KeyError, TypeError):
            raise ValueError(f"{text!r} is not a {cls.__name__}") from None


class Verdict(Word):
    """What the scan says of one function, in the order they are reported."""

    COVERED = "covered"  # the upstream autograd codegen emits an ADInplaceOrView kernel
    MISSING = "missing"  # mutates, returns nothing, not a view: no kernel, no bump guarantee
    UNSUPPORTED = "unsupported"  # mutates and returns nothing, but a generated kernel cannot serve it
    COMPOSITE = "composite"  # mutates and returns, no kernel of its own: decomposes into ops that bump
    NOT_MUTATING = "not_mutating"


class Kind(Word):
    """torchgen's SchemaKind of a function."""

    FUNCTIONAL = "functional"
    INPLACE = "inplace"
    OUT = "out"
    MUTABLE = "mutable"
    SCRATCH = "scratch"


class Form(Word):
    """How a written argument is passed."""

    TENSOR = "tensor"
    TENSOR_LIST = "tensor_list"
    OPTIONAL_TENSOR = "optional_tensor"
    OPTIONAL_TENSOR_LIST = "optional_tensor_list"


class Action(Word):
    """An overlay entry's decision about one op."""

    GENERATE = "generate"
    SKIP = "skip"
    XFAIL = "xfail"


class Outcome(Word):
    """A verify row's verdict on one op."""

    PASS = "PASS"  # every written tensor +1
    MISS = "MISS"  # some tensor not bumped
    EXTRA = "EXTRA"  # some tensor bumped more than once
    ERROR = "ERROR"  # the call raised
    NOT_RUN = "NOT_RUN"  # no sample on this device
    XFAIL = "XFAIL"  # failed, as the overlay expects
    XPASS = "XPASS"  # passed, where the overlay expects a failure
    # verify --check requires-grad
    REFUSE = "REFUSE"  # an out= op refused an argument that requires grad, writing nothing
    SILENT = "SILENT"  # it went through: gradients through its outputs are dropped without a word


class Gap(Word):
    """What the autograd codegen's VariableType kernel of a void op leaves out."""

    NONE = ""
    OUT = "out"  # an out= op: inputs or outputs that require grad are never refused
    INPLACE = "inplace"  # an in-place op: no check_inplace (a leaf that requires grad can be written)


class StepOutcome(Word):
    """What a probe step of an optimizer class shows (``lint --runtime --import``)."""

    BUMPS = "bumps"  # its step changed the parameter and moved its version
    UNSEEN = "unseen"  # changed it and moved no version: autograd cannot see the write
    COVERED = "covered"  # an optimizer entry of the overlay covers the class (not probed)
    UNCHANGED = "unchanged"  # its probe steps changed no parameter: nothing learned
    NOT_RUN = "not_run"  # it could not be constructed or stepped


class Backend(Word):
    CPP = "cpp"  # the compiled kernels
    PYTHON = "python"  # torch.library kernels, no compiler needed


class Origin(Word):
    """Where a library of kernels came from (``runtime.Artifact.origin``)."""

    PREBUILT = "prebuilt"  # an installed prebuilt kernels wheel
    CACHE = "cache"  # the cache's build, made before
    BUILD = "build"  # compiled now
    GIVEN = "given"  # a path the caller named


class Format(Word):
    """Report formats (lint: text to github; verify: text, json, markdown; scan: text, json)."""

    TEXT = "text"
    JSON = "json"
    LINTRUNNER = "lintrunner"
    SARIF = "sarif"
    GITHUB = "github"
    MARKDOWN = "markdown"


LINT_FORMATS = (Format.TEXT, Format.JSON, Format.LINTRUNNER, Format.SARIF, Format.GITHUB)
VERIFY_FORMATS = (Format.TEXT, Format.JSON, Format.MARKDOWN)
SCAN_FORMATS = (Format.TEXT, Format.JSON)
FINDINGS_FORMATS = (Format.TEXT, Format.JSON, Format.MARKDOWN)


class CheckMode(Word):
    """What the saved-tensor check does with a finding."""

    WARN = "warn"  # one line per distinct finding on stderr, a count at exit
    RAISE = "raise"  # an exception at the first one


class Writer(Word):
    """Who may have written a saved tensor without moving its version, as a finding lists them."""

    OPTIMIZER = "optimizer"  # an optimizer step ran between save and use and holds the tensor
    TRITON = "triton"  # a Triton kernel launched between save and use had a pointer into its storage
    STORAGE = "storage"  # the tensor was given other storage (`p.data = other`, set_data)
    DATA = "data"  # an in-place op on `.data` (a view with a version counter of its own)
    ALIAS = "alias"  # a numpy, DLPack or buffer alias of its memory
    KERNEL = "kernel"  # a C++ or Triton kernel of a library writing through data_ptr
    HOOKS = "hooks"  # the program's own saved-tensor hooks gave back other contents (a recomputation)
