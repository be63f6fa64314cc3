"""The launch spec: what every Python process of a program under `run` (``$TORCHGEN_PATCH_RUN``) or of
an enabled environment (its data file) installs, as one frozen value. ``LaunchSpec.parse`` is the one
reader of its text (the project's JSON reader: depth-limited, every failure one line) and checks every
field as it builds the value; ``to_json`` is the one writer. Nothing else reads or writes a spec's
JSON, and nothing indexes it as a dict.

The site hook imports this module only once torch has been imported (never at interpreter start), from
where the hook itself is installed; it imports nothing beyond the package and the standard library.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ...errors import InputError
from ...sources import Options
from ...vocabulary import Backend, CheckMode

NOT_A_SPEC = "not a launch spec of torchgen-patch"


@dataclass(frozen=True)
class LaunchSpec:
    """What to install in each process. ``options`` travel with absolute paths; ``library``: the build
    an enabled environment made (or run's --runtime-op check found); ``boxed``: the boxed library of
    the runtime ops; ``roots``: where this tool and each of its dependencies are imported from (module
    name -> sys.path entry); ``check_saved``: the saved-tensor check's mode in each process (None:
    off); ``strict``: an enabled environment's process that cannot have the kernels stops;
    ``enabled_by``: which torchgen-patch wrote an enabled environment's data file (``torchgen_patch``:
    its version, ``hook``: its hook's path), None under `run`; ``findings``: the folder (absolute) each
    process's check writes its findings to (``saved/fleet.py``), or None; ``check_every``: the check
    sampled by step, each step checked with probability 1/check_every (1: every step); ``toolchain``: the
    compiler `enable` ran with (``cxx``, the ``path`` its driver runs with, extra ``cflags``), which the
    environment's processes started without PATH build with (None: their own); ``saved_library``: the
    build of the check's native hooks `enable` made (checked at load, never rebuilt; None: found as ever)."""

    backend: Backend
    ops: tuple[str, ...] | None
    runtime_ops: tuple[str, ...]
    imports: tuple[str, ...]
    library: str | None
    boxed: str | None
    options: Options
    quiet: bool
    verbose: bool
    roots: dict[str, str]
    check_saved: CheckMode | None
    strict: bool
    enabled_by: dict[str, str] | None = None
    findings: str | None = None
    check_every: int = 1
    toolchain: dict[str, str] | None = None
    saved_library: str | None = None

    @classmethod
    def parse(cls, text: str | bytes | None, source: str) -> LaunchSpec:
        """The spec in ``text``, every field checked; an InputError naming ``source`` (where the text
        came from: ``$TORCHGEN_PATCH_RUN``, an enabled environment's data file) and what is wrong, in
        one line, with what to do about it."""
        try:
            return cls._build(text)
        except ValueError as e:
            raise InputError(None, None, f"{source}: {e}", hint_for(source)) from None

    @classmethod
    def _build(cls, text) -> LaunchSpec:
        from ...fs.decode import loads

        try:
            raw = loads(text or "")
        except ValueError as e:
            raise ValueError(f"{NOT_A_SPEC} ({type(e).__name__}: {e})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{NOT_A_SPEC} (not a JSON object)")
        for name, kinds in _TYPES.items():
            value = raw.get(name)
            if not isinstance(value, kinds) or isinstance(value, list) and not all(isinstance(x, str) for x in value):
                raise ValueError(f"{NOT_A_SPEC} ({name!r} is {type(value).__name__})")
        unknown = sorted(set(raw) - set(_TYPES) - {"enabled_by", "toolchain"})
        if unknown:
            raise ValueError(f"{NOT_A_SPEC} (unknown key {unknown[0]!r})")
        for name in ("roots", "enabled_by", "toolchain"):
            value = raw.get(name)
            if value is not None and (not isinstance(value, dict) or
                                      not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
                raise ValueError(f"{NOT_A_SPEC} ({name!r} is not a table of strings)")
        if "torchgen_patch" not in raw["roots"]:
            raise ValueError(f"{NOT_A_SPEC} ('roots' names no 'torchgen_patch')")
        if raw["backend"] not in tuple(Backend):
            raise ValueError(f"unknown backend {raw['backend']!r}")
        if raw["check_saved"] is not None and raw["check_saved"] not in tuple(CheckMode):
            raise ValueError(f"unknown saved-tensor check mode {raw['check_saved']!r}")
        every = raw.get("check_every")
        if every is not None and (isinstance(every, bool) or every < 1):
            raise ValueError(f"{NOT_A_SPEC} ('check_every' is {every!r}, not a whole number >= 1)")
        if raw.get("findings") is not None and not raw["findings"].startswith("/"):
            raise ValueError(f"{NOT_A_SPEC} ('findings' is not an absolute path)")
        try:
            options = Options(**raw["options"])
        except TypeError as e:
            raise ValueError(f"{NOT_A_SPEC} ({e})") from None

        def strings(name):
            return None if raw[name] is None else tuple(raw[name])

        return cls(backend=Backend(raw["backend"]), ops=strings("ops"), runtime_ops=strings("runtime_ops"),
                   imports=strings("imports"), library=raw["library"], boxed=raw["boxed"], options=options,
                   quiet=raw["quiet"], verbose=raw["verbose"], roots=dict(raw["roots"]),
                   check_saved=None if raw["check_saved"] is None else CheckMode(raw["check_saved"]),
                   strict=raw["strict"], enabled_by=raw.get("enabled_by"), findings=raw.get("findings"),
                   check_every=1 if every is None else every, toolchain=raw.get("toolchain"),
                   saved_library=raw.get("saved_library"))

    def to_dict(self) -> dict:
        """The spec as its JSON object holds it (plain strings, lists and tables)."""
        out: dict[str, Any] = {"backend": str(self.backend.value), "ops": None if self.ops is None else list(self.ops),
               "runtime_ops": list(self.runtime_ops), "imports": list(self.imports), "library": self.library,
               "boxed": self.boxed, "options": dataclasses.asdict(self.options), "quiet": self.quiet,
               "verbose": self.verbose, "roots": dict(self.roots),
               "check_saved": None if self.check_saved is None else str(self.check_saved.value),
               "strict": self.strict}
        if self.enabled_by is not None:
            out["enabled_by"] = dict(self.enabled_by)
        if self.findings is not None:  # only where set: a spec without it reads as before
            out["findings"] = self.findings
        if self.check_every != 1:  # likewise: 1, every step, is what a spec without it means
            out["check_every"] = self.check_every
        if self.toolchain is not None:
            out["toolchain"] = dict(self.toolchain)
        if self.saved_library is not None:
            out["saved_library"] = self.saved_library
        return out

    def to_json(self) -> str:
        """The spec's one text form (keys sorted: the same spec is the same text), which ``parse`` reads back."""
        return json.dumps(self.to_dict(), sort_keys=True)


_TYPES: dict[str, type | tuple[type, ...]]  # each field's type(s) for isinstance
_TYPES = {"backend": str, "ops": (list, type(None)), "runtime_ops": list, "imports": list,
          "library": (str, type(None)), "boxed": (str, type(None)), "options": dict, "quiet": bool,
          "verbose": bool, "roots": dict, "check_saved": (str, type(None)), "strict": bool,
          # optional: a spec without them has none
          "findings": (str, type(None)), "check_every": (int, type(None)), "saved_library": (str, type(None))}


def written_by(text: str | bytes) -> tuple[str, str]:
    """Which torchgen-patch wrote an enabled environment's data file ``text``: (its version, its hook's path),
    from the spec's ``enabled_by``, read before the spec itself is (a spec of another version is said as that,
    not as what this one makes of it). ValueError where the text names none."""
    from ...fs.decode import loads

    raw = loads(text)
    by = raw.get("enabled_by") if isinstance(raw, dict) else None
    version, hook = (by.get("torchgen_patch"), by.get("hook")) if isinstance(by, dict) else (None, None)
    if not isinstance(version, str) or not isinstance(hook, str):
        raise ValueError(f"{NOT_A_SPEC} (it names no torchgen-patch that wrote it)")
    return version, hook


def is_run_source(source: str) -> bool:
    """Whether ``source`` is run's ``$TORCHGEN_PATCH_RUN`` (else: an enabled environment's data file)."""
    return source.startswith("$")


def hint_for(source: str) -> str:
    """What to do about a launch spec from ``source`` that is not one."""
    return "torchgen-patch run sets it: unset it" if is_run_source(source) else \
        "`torchgen-patch enable` writes it again, `torchgen-patch disable` removes it"
