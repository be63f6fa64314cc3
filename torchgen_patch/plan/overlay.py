"""native_functions_overlay.yaml: per-op decisions, validated strictly.

Format (a mapping keyed by operator name with overload)::

    aten::split_with_sizes_copy.out:
      action: generate            # generate (default) | skip | xfail
      template: kernel.cpp.j2     # optional: another template from templates/
    aten::some_op.out:
      action: skip
      reason: why this op gets no kernel     # mandatory for skip and xfail
    aten::other_op_:
      action: xfail
      reason: why verify is expected to fail
      devices: [cuda]             # xfail only: where (default: everywhere)
    aten::split_copy.Tensor_out:
      requires_grad: allow        # refuse (default) | allow: no out= requires-grad refusal in its kernel

and one section for optimizers whose ``step()`` writes tensors outside the dispatcher (through
C++ bound with pybind, ``p.data``, raw pointers), so that no version counter moves::

    optimizers:
      deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam:   # the class, by the module that defines it
        writes: [params, state]   # params: each parameter that has a gradient when the step starts;
                                  # state: the tensors of its state (optimizer.state[p]) as they were then
        reason: what its step writes, and how        # mandatory

Every problem is an InputError at the overlay's file:line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..files import read_text
from .. import cache
from ..scan.model import MISSING, UNSUPPORTED, OpRecord, Scan
from ..vocabulary import Action
from ..sources import Sources

ACTIONS = tuple(Action)
_WITH_REASON = (Action.SKIP, Action.XFAIL)  # the actions that need a reason (and all a runtime operator takes)
KEYS = {"action", "reason", "template", "devices", "requires_grad"}
REQUIRES_GRAD = ("refuse", "allow")  # an out= op's kernel refuses inputs/outputs that require grad, or not
DEVICES = ("cpu", "cuda")
OPTIMIZERS = "optimizers"  # the section of optimizer entries
OPTIMIZER_KEYS = {"writes", "reason"}
WRITES = ("params", "state")
_CLASS_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


@dataclass(frozen=True)
class Entry:
    op: str
    line: int
    action: Action = Action.GENERATE
    reason: str | None = None
    template: str | None = None
    devices: tuple[str, ...] = ()
    requires_grad: str = "refuse"


@dataclass(frozen=True)
class OptimizerEntry:
    """An optimizer class whose step writes ``writes`` without moving their version counters."""

    path: str  # module.Class, as the module that defines it (or re-exports it) names it
    line: int
    writes: tuple[str, ...]  # members of WRITES
    reason: str


@dataclass(frozen=True)
class Overlay:
    path: str | None
    entries: dict[str, Entry]
    optimizers: dict[str, OptimizerEntry] = field(default_factory=dict)

    def get(self, op: str) -> Entry | None:
        return self.entries.get(op)

    def skipped(self, op: str) -> bool:
        e = self.entries.get(op)
        return e is not None and e.action == Action.SKIP


def empty() -> Overlay:
    return Overlay(None, {})


def load(sources: Sources, scan: Scan, templates: set[str]) -> Overlay:
    """The sources' overlay, parsed and validated against ``scan`` (cached by content).

    The shipped overlay is written for the installed torch's yaml: applied to
    another yaml, its entries for ops that yaml does not have (or does not
    miss) are dropped instead of being errors; every other check stays strict.
    """
    if sources.overlay is None:
        return empty()
    import hashlib

    path, shipped = sources.overlay, sources.overlay_shipped
    text = read_text(path, "overlay")
    h = hashlib.sha256((scan.key + "\0" + ",".join(sorted(templates)) + "\0" + text).encode())
    name = f"overlay-{'shipped-' if shipped else ''}{h.hexdigest()[:32]}.json"
    cached = cache.read(name)
    if cached is not None:
        try:
            return Overlay(path, _cached_entries(cached, scan, templates), _cached_optimizers(cached))
        except (TypeError, KeyError, ValueError, AttributeError) as e:  # damaged or edited: parse again
            cache.invalid(name, f"{type(e).__name__}: {e}")
    result = _parse(path, text, scan, templates, shipped)
    from dataclasses import asdict

    cache.write(name, {"overlay": 2, "entries": [asdict(e) for e in result.entries.values()],
                       "optimizers": [asdict(e) for e in result.optimizers.values()]})
    return result


def _cached_optimizers(data) -> dict[str, OptimizerEntry]:
    """The optimizer entries of a cached overlay, checked as the parser would have."""
    out = {}
    for e in data["optimizers"]:
        entry = OptimizerEntry(**dict(e, writes=tuple(e["writes"])))
        if not (isinstance(entry.path, str) and _CLASS_PATH.match(entry.path) and type(entry.line) is int
                and entry.writes and all(w in WRITES for w in entry.writes)
                and isinstance(entry.reason, str) and entry.reason.strip()):
            raise ValueError(f"optimizer entry {entry.path!r} is not one the overlay's parser makes")
        out[entry.path] = entry
    return out


def _cached_entries(data, scan: Scan | None, templates: set[str]) -> dict[str, Entry]:
    """The entries of a cached overlay, each field checked as the parser would have (a cache is input)."""
    if not isinstance(data, dict) or data.get("overlay") != 2:
        raise ValueError("not an overlay entry of this version")
    out = {}
    for e in data["entries"]:
        entry = Entry(**dict(e, devices=tuple(e["devices"]), action=Action.parse(e["action"])))
        ok = (isinstance(entry.op, str)
              and ((scan is not None and scan.get(entry.op) is not None) or not entry.op.startswith("aten::"))
              and type(entry.line) is int
              and (entry.template is None or entry.template in templates)
              and all(d in DEVICES for d in entry.devices)
              and (entry.reason is None or isinstance(entry.reason, str))
              and getattr(entry, "requires_grad", "refuse") in REQUIRES_GRAD)
        if not ok:
            raise ValueError(f"entry {entry.op!r} is not one the overlay's parser makes")
        out[entry.op] = entry
    return out


def load_runtime(path: str) -> Overlay:
    """Only the overlay's entries for runtime operators (any namespace but aten) and optimizers, for
    ``install()``'s optimizer hooks, ``install(runtime_ops=...)`` and ``lint --runtime``, which read
    no yaml; cached by the overlay's bytes (a cached ``install()`` imports no yaml parser)."""
    import hashlib

    text = read_text(path, "overlay")
    name = f"overlay-runtime-{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"
    cached = cache.read(name)
    if cached is not None:
        try:
            return Overlay(path, _cached_entries(cached, None, set()), _cached_optimizers(cached))
        except (TypeError, KeyError, ValueError, AttributeError) as e:  # damaged or edited: parse again
            cache.invalid(name, f"{type(e).__name__}: {e}")
    result = _parse(path, text, None, set(), shipped=False)
    from dataclasses import asdict

    cache.write(name, {"overlay": 2, "entries": [asdict(e) for e in result.entries.values()],
                       "optimizers": [asdict(e) for e in result.optimizers.values()]})
    return result


MAX_BYTES = 128 * 1024  # about 1,500 entries, a hundred times the shipped overlay


def _compose(path: str, text: str):
    """The overlay's node tree. libyaml first: it bounds nesting at 1,000 levels, where the pure-Python
    scanner is quadratic in the depth of flow collections; a file it refuses goes through the
    pure-Python loader, whose messages (the ones overlay errors have always had) are reported."""
    import yaml

    from ..files import check_depth, yaml_error

    check_depth(path, text, "the overlay")
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return yaml.compose(text, Loader=fast)
        except yaml.YAMLError as e:
            if "maximum nesting depth" in str(e):
                raise yaml_error(path, text, e) from None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise yaml_error(path, text, e) from None
    except RecursionError:  # the pure-Python composer recurses once per nesting level
        raise InputError(path, None, "malformed YAML: nested too deeply for an overlay") from None


def _parse(path: str, text: str, scan: Scan | None, templates: set[str], shipped: bool = False) -> Overlay:
    """``scan`` None: keep the runtime entries only (the aten ones are not checked)."""
    import yaml

    if len(text) > MAX_BYTES:  # composing costs about a second per 100 KB
        raise InputError(path, None, f"the overlay is {len(text):,} characters long; the limit is {MAX_BYTES:,}")
    root = _compose(path, text)
    if root is None:
        return Overlay(path, {})
    if not isinstance(root, yaml.MappingNode):
        raise InputError(path, root.start_mark.line + 1, "overlay must be a mapping keyed by operator name")
    entries: dict[str, Entry] = {}
    optimizers: dict[str, OptimizerEntry] | None = None
    for knode, vnode in root.value:
        line = knode.start_mark.line + 1
        if not isinstance(knode, yaml.ScalarNode):
            raise InputError(path, line, "operator name must be a string")
        op = knode.value
        if op == OPTIMIZERS:
            if optimizers is not None:
                raise InputError(path, line, f"duplicate section '{OPTIMIZERS}'")
            optimizers = _optimizers(path, line, vnode)
            continue
        if op in entries:
            raise InputError(path, line, f"duplicate entry for '{op}'", f"first at line {entries[op].line}")
        if "::" in op and not op.startswith("aten::"):
            entries[op] = _runtime_entry(path, op, line, vnode)
            continue
        if scan is None or (shipped and scan.verdict_of(op) not in (MISSING, UNSUPPORTED)):
            continue
        entries[op] = _entry(path, op, line, vnode, scan, templates)
    return Overlay(path, entries, optimizers or {})


def _optimizers(path: str, line: int, node) -> dict[str, OptimizerEntry]:
    """The ``optimizers:`` section: class path -> what its step writes, each field checked."""
    import yaml

    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
        return {}  # a section with no entries yet
    if not isinstance(node, yaml.MappingNode):
        raise InputError(path, line, f"'{OPTIMIZERS}' must be a mapping keyed by optimizer class "
                                     "(module.Class)")
    out: dict[str, OptimizerEntry] = {}
    for knode, vnode in node.value:
        kl = knode.start_mark.line + 1
        cls = knode.value if isinstance(knode, yaml.ScalarNode) else None
        if not isinstance(cls, str) or not _CLASS_PATH.match(cls):
            raise InputError(path, kl, f"optimizer class {cls!r} is not a class path",
                             "name it as module.Class, e.g. 'deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam'")
        if cls in out:
            raise InputError(path, kl, f"duplicate entry for '{cls}'", f"first at line {out[cls].line}")
        out[cls] = _optimizer_fields(path, cls, kl, vnode)
    return out


def _optimizer_fields(path: str, cls: str, line: int, node) -> OptimizerEntry:
    import yaml

    fields: dict[str, Any] = {}  # a string or a tuple of strings, as the key wants
    for key, kl, v in _keys(path, cls, node, OPTIMIZER_KEYS):
        if key == "writes":
            if not isinstance(v, yaml.SequenceNode) or not v.value or \
                    not all(isinstance(x, yaml.ScalarNode) and x.tag == "tag:yaml.org,2002:str" for x in v.value):
                raise InputError(path, kl, "'writes' must be a non-empty list of strings",
                                 f"from: {', '.join(WRITES)}")
            seen: list[str] = []
            for x in v.value:
                if x.value not in WRITES:
                    close = _difflib().get_close_matches(x.value, WRITES, n=1)
                    raise InputError(path, x.start_mark.line + 1, f"unknown 'writes' item '{x.value}'",
                                     f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(WRITES)}")
                if x.value in seen:
                    raise InputError(path, x.start_mark.line + 1, f"'{x.value}' is listed twice in 'writes'")
                seen.append(x.value)
            fields[key] = tuple(seen)
        else:
            if not isinstance(v, yaml.ScalarNode) or v.tag != "tag:yaml.org,2002:str":
                raise InputError(path, kl, f"'{key}' must be a string")
            fields[key] = v.value
    if "writes" not in fields:
        raise InputError(path, line, f"'{cls}': an optimizer entry needs 'writes'", "writes: [params] or "
                                                                                    "[params, state]")
    if not str(fields.get("reason", "")).strip():
        raise InputError(path, line, f"'{cls}': an optimizer entry needs a non-empty 'reason'",
                         "what its step writes, and how autograd misses it")
    return OptimizerEntry(cls, line, fields["writes"], fields["reason"])


def _runtime_entry(path, op, line, node) -> Entry:
    """An operator of the live registry (an extension's custom op): no yaml to check it
    against, so only a decision not to patch it, with its reason, is accepted."""
    e = _fields(path, op, line, node)
    if e.action not in _WITH_REASON or e.template is not None:
        raise InputError(path, line, f"'{op}' is a runtime operator: only 'action: skip' or 'action: xfail' "
                                     "(with a reason) apply to it", "its kernel is the boxed one, not a template")
    return e


def _entry(path, op, line, node, scan: Scan, templates: set[str]) -> Entry:
    import yaml

    verdict = scan.verdict_of(op)
    if verdict is None:
        hint = None
        if "::" not in op and _difflib().get_close_matches(op, [OPTIMIZERS], n=1, cutoff=0.8):
            hint = f"did you mean '{OPTIMIZERS}'?"
        elif "::" not in op and isinstance(node, yaml.MappingNode) and \
                any(getattr(k, "value", None) == "writes" for k, _ in node.value):
            hint = f"an optimizer entry goes in the '{OPTIMIZERS}:' section"
        elif "::" not in op:
            hint = f"operator names carry their namespace: 'aten::{op}'"
        else:
            close = _difflib().get_close_matches(op, scan.names(), n=3, cutoff=0.6)
            if close:
                hint = "did you mean " + ", ".join(f"'{c}'" for c in close) + "?"
        raise InputError(path, line, f"unknown operator '{op}'", hint)
    if verdict not in (MISSING, UNSUPPORTED):
        rec: OpRecord = scan.get(op)  # type: ignore[assignment]  # it has a verdict: a record
        raise InputError(path, line, f"'{op}' is {verdict} ({rec.reason}), not missing: nothing to decide")
    return _fields(path, op, line, node, templates)


def _fields(path, op, line, node, templates: set[str] | None = None) -> Entry:
    """The entry's keys, each checked (``templates`` None: the template name is not looked up)."""
    import yaml

    fields: dict[str, Any] = {}  # a string or a tuple of strings, as the key wants
    lines: dict[str, int] = {}
    for key, kl, v in _keys(path, op, node, KEYS):
        lines[key] = kl
        if key == "devices":
            if not isinstance(v, yaml.SequenceNode) or not all(isinstance(x, yaml.ScalarNode) for x in v.value):
                raise InputError(path, kl, "'devices' must be a list of strings")
            fields[key] = tuple(x.value for x in v.value)
        else:
            if not isinstance(v, yaml.ScalarNode) or v.tag != "tag:yaml.org,2002:str":
                raise InputError(path, kl, f"'{key}' must be a string")
            fields[key] = v.value
    try:
        action = Action.parse(fields.get("action", Action.GENERATE))
    except ValueError:
        raise InputError(path, lines["action"], f"action must be one of {', '.join(ACTIONS)}, "
                                                f"not '{fields['action']}'") from None
    reason = fields.get("reason")
    if action in _WITH_REASON and not (isinstance(reason, str) and reason.strip()):
        raise InputError(path, line, f"'{op}': action '{action}' needs a non-empty 'reason'")
    template = fields.get("template")
    if template is not None and templates is not None and template not in templates:
        close = _difflib().get_close_matches(template, sorted(templates), n=1)
        raise InputError(path, lines["template"], f"no template '{template}' in templates/",
                         f"did you mean '{close[0]}'?" if close else None)
    devices = fields.get("devices", ())
    if devices and action != Action.XFAIL:
        raise InputError(path, lines["devices"], "'devices' applies to action 'xfail' only")
    for d in devices:
        if d not in DEVICES:
            raise InputError(path, lines["devices"], f"unknown device '{d}'", f"allowed: {', '.join(DEVICES)}")
    requires_grad = fields.get("requires_grad", "refuse")
    if requires_grad not in REQUIRES_GRAD:
        raise InputError(path, lines["requires_grad"], f"requires_grad must be one of {', '.join(REQUIRES_GRAD)}, "
                                                       f"not '{requires_grad}'")
    return Entry(op, line, action, reason, template, tuple(devices), requires_grad)


def _keys(path: str, name: str, node, allowed: set[str]):
    """(key, its line, its value node) of the entry ``node`` for ``name``: a mapping whose keys are
    each in ``allowed`` (an unknown one answered with the closest) and given once."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        raise InputError(path, node.start_mark.line + 1, f"entry for '{name}' must be a mapping")
    seen: set[str] = set()
    for k, v in node.value:
        kl = k.start_mark.line + 1
        key = k.value if isinstance(k, yaml.ScalarNode) else None
        if key not in allowed:
            close = _difflib().get_close_matches(str(key), sorted(allowed), n=1)
            raise InputError(path, kl, f"unknown key '{key}' in entry for '{name}'",
                             f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(sorted(allowed))}")
        if key in seen:
            raise InputError(path, kl, f"duplicate key '{key}'")
        seen.add(key)
        yield key, kl, v


def _difflib():
    import difflib  # only on an error path

    return difflib
