"""The one module that talks to torchgen and to the autograd codegen beside it.

A ``Toolchain`` names one torchgen package and one autograd codegen:
- *installed*: the torchgen that ships with the installed torch, and its
  ``torchgen.packaged.autograd``;
- *checkout*: a PyTorch source checkout's own ``torchgen/`` and
  ``tools/autograd/``.
Every call into torchgen runs inside ``imported(toolchain)``, a private import
context: the modules named ``torchgen*`` and ``tools*`` of that toolchain are
swapped into ``sys.modules`` for the duration and swapped out after, so two
toolchains never mix in one process and the caller's own imports are left as
they were. What leaves this module is plain data (``Facts``), never a torchgen
object. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import os
import re
import sys
import threading
from typing import Any, NamedTuple

from ..errors import InputError, one_line
from ..files import check_depth, yaml_error
from ..vocabulary import Form, Gap, Kind
from .facts import CppSig, Facts, WrittenArg, kernel_candidate
from .rejected import rejected, where_failed, whose
from .toolchain import CHECKOUT, Toolchain
from .yaml_bounds import MAX_ENTRIES, bounded, check_duplicates, refuse_shared

_GAP_KINDS = (Kind.OUT, Kind.INPLACE)  # the void ops whose VariableType kernel is asked what it checks
_OWNED = ("torchgen", "tools")


# ---------------------------------------------------------------------------
# The import context


_LOCK = threading.RLock()
_MODULES: dict[tuple[Toolchain, str], dict] = {}  # each toolchain's own modules, by content identity
_ACTIVE: list[tuple[Toolchain, str]] = []


def _owned(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in _OWNED)


def _from(module, directory: str) -> bool:
    f = getattr(module, "__file__", None) or ""
    return bool(f) and os.path.abspath(f).startswith(directory + os.sep)


@contextlib.contextmanager
def imported(tc: Toolchain, identity: str | None = None):
    """Run the body with ``tc``'s torchgen (and autograd codegen) as the importable ones.

    The toolchain's modules are always its own: imported afresh the first time its content
    (``identity``, ``tc.identity()`` when the caller has it) is seen, never borrowed from the
    process (a torchgen that torch imported stays the caller's, untouched), and kept for the
    next context of the same content. In a checkout, bytecode goes to a private directory
    named by that identity: never into the checkout, never stale after an edit.

    The swap is of the process's import state, under a lock: another thread that imports
    ``torchgen`` or ``tools`` while a context is open can see this toolchain's modules.
    """
    with _LOCK:
        key = (tc, identity or tc.identity())
        if _ACTIVE and _ACTIVE[-1] == key:  # nested use of the same toolchain
            yield
            return
        if _ACTIVE:  # nested inside another toolchain: keep what that one has imported so far
            _MODULES[_ACTIVE[-1]] = {n: m for n, m in sys.modules.items() if _owned(n)}
        saved = {n: m for n, m in sys.modules.items() if _owned(n)}
        for n in saved:
            del sys.modules[n]
        sys.modules.update(_MODULES.get(key, {}))
        path, prefix = list(sys.path), sys.pycache_prefix
        sys.path.insert(0, tc.path_entry)
        if tc.world == CHECKOUT:
            sys.pycache_prefix = _bytecode_dir(key[1]) or prefix
        importlib.invalidate_caches()
        _ACTIVE.append(key)
        try:
            yield
        finally:
            _ACTIVE.pop()
            mine = {n: m for n, m in sys.modules.items() if _owned(n)}
            _MODULES[key] = mine
            for n in mine:
                del sys.modules[n]
            sys.modules.update(saved)
            sys.path[:] = path
            sys.pycache_prefix = prefix


def _bytecode_dir(identity: str) -> str | None:
    """Beside the result cache, not in it, and only when private (``cache.bytecode_dir``)."""
    from ..cache import bytecode_dir

    return bytecode_dir(identity)


def _import(tc: Toolchain, name: str):
    """Import ``name`` from ``tc`` (inside ``imported(tc)``), failing as bad input, by file and line."""
    try:
        module = importlib.import_module(name)
    except SyntaxError as e:
        raise InputError(e.filename or tc.path_entry, e.lineno, f"cannot import {name}: {e.msg}",
                         _import_hint(tc)) from None
    except ImportError as e:
        raise InputError(*where_failed(tc, name, e), f"cannot import {name}: {one_line(e)}", _import_hint(tc)) from None
    except Exception as e:  # noqa: BLE001 — the module itself raised while importing
        raise InputError(*where_failed(tc, name, e), f"cannot import {name}: {type(e).__name__}: {one_line(e)}",
                         "is the checkout intact?" if tc.world == CHECKOUT else None) from None
    if not _from(module, tc.path_entry):
        raise InputError(getattr(module, "__file__", None) or tc.path_entry, None,
                         f"{name} was imported from outside the {tc.world} toolchain at {tc.path_entry}",
                         "a torchgen from elsewhere is mixed in; run with a clean PYTHONPATH")
    return module


def _import_hint(tc: Toolchain) -> str:
    if tc.world == CHECKOUT:
        return "the checkout's torchgen and tools/autograd need pyyaml and typing_extensions; is the checkout intact?"
    return "is the installed torch complete?"


# ---------------------------------------------------------------------------
# YAML and parsing


def load_yaml_list(tc: Toolchain, path: str, text: str, what: str) -> list:
    """``text`` through the toolchain's own LineLoader (``__line__`` per entry)."""
    import yaml

    loader = bounded(_import(tc, "torchgen.gen").LineLoader)
    check_depth(path, text, what)
    try:
        es = yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        raise yaml_error(path, text, e) from None
    except AssertionError as e:  # torchgen's loader refuses duplicate keys this way
        m = re.search(r"key=(.*?), line=(\d+)", str(e))
        line = int(m.group(2)) + 1 if m else None
        what = f"duplicate key '{m.group(1)}'" if m else one_line(e)
        raise InputError(path, line, f"malformed YAML: {what}") from None
    if not isinstance(es, list) or not es:
        raise InputError(path, 1, f"{what} must be a non-empty YAML list of entries")
    if len(es) > MAX_ENTRIES:  # torchgen's parse costs about a millisecond an entry
        raise InputError(path, None, f"{what} has {len(es):,} entries; the limit is {MAX_ENTRIES:,} (PyTorch's "
                                     "own has about 2,600)")
    for entry in es:
        if not isinstance(entry, dict):
            raise InputError(path, 1, f"{what}: every entry must be a mapping, got {type(entry).__name__}")
    refuse_shared(path, es, what)
    return es


def facts(tc: Toolchain, native_path: str, tags_path: str, native_text: str, tags_text: str,
          identity: str | None = None, autograd: bool = True) -> list[Facts]:
    """Parse both files with ``tc``'s torchgen (once) and ask its autograd codegen
    about every function (and torchgen's C++ API about every candidate). ``autograd``
    False: the VariableType kernels are not asked about (``Facts.autograd_gap`` stays
    empty; it costs loading derivatives.yaml, about as much again as the parse)."""
    with imported(tc, identity), _gc_paused():
        gen = _import(tc, "torchgen.gen")
        tag_es = load_yaml_list(tc, tags_path, tags_text, "tags.yaml")
        try:
            tags = gen.parse_tags_yaml_struct(tag_es, path=tags_path)
        except Exception as e:  # noqa: BLE001 — torchgen raises bare AssertionError/KeyError
            raise rejected(tc, tags_path, e) from None
        es = load_yaml_list(tc, native_path, native_text, "native_functions.yaml")
        check_duplicates(native_path, es)
        try:
            parsed = gen.parse_native_yaml_struct(es, tags, path=native_path)
        except Exception as e:  # noqa: BLE001 — torchgen's parser raises bare AssertionError/KeyError
            raise rejected(tc, native_path, e, es) from None
        raw = {e["__line__"]: e["func"].strip() for e in es}
        try:
            return _Asker(tc, native_path, tags_path, parsed, autograd).all(list(parsed.native_functions), raw)
        except (AttributeError, TypeError, KeyError, ValueError) as e:  # a codegen of another shape than asked
            # here (ValueError: a SchemaKind of no Kind; TypeError: a write annotation on another type)
            where = os.path.join(tc.autograd_dir, "gen_inplace_or_view_type.py")
            raise InputError(where, None, f"the {whose(tc)} autograd codegen does not have the shape this tool "
                                          f"asks: {type(e).__name__}: {one_line(e)}",
                             "known to work: the codegen of torch 2.4 to 2.14") from None


@contextlib.contextmanager
def _gc_paused():
    """The parse allocates about a million long-lived objects and no cyclic garbage to
    speak of; the cyclic collector would traverse them again and again (about 15% of
    a cold scan). Paused for the parse, restored after; reference counting still frees."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Asker:
    """The autograd codegen's own decisions, asked per function (inside ``imported``)."""

    def __init__(self, tc: Toolchain, native_path: str, tags_path: str, parsed=None, autograd: bool = True):
        self.tc, self.native_path, self.tags_path = tc, native_path, tags_path
        self.parsed, self.autograd = parsed, autograd
        self.g = _import(tc, f"{tc.autograd}.gen_inplace_or_view_type")
        self.t = _import(tc, f"{tc.autograd}.gen_trace_type")
        self.NFWDI = _import(tc, "torchgen.api.autograd").NativeFunctionWithDifferentiabilityInfo
        self.cpp = _import(tc, "torchgen.api.cpp")
        self.manual = frozenset(self.t.MANUAL_AUTOGRAD)
        self.manual_bases = frozenset(m.rstrip("_") for m in self.manual)
        self._infos = None

    def all(self, functions: list, raw: dict[int, str]) -> list[Facts]:
        written = [tuple(WrittenArg(a.name, _form(a.type)) for a in f.func.arguments.flat_all
                         if a.annotation is not None and a.annotation.is_write) for f in functions]
        views = [self.g.get_view_info(f) is not None for f in functions]
        registers = [self.registers(f) if w or v else False for f, w, v in zip(functions, written, views, strict=True)]
        bases = {str(f.func.name.name.base) for f, r in zip(functions, registers, strict=True)
                 if r and not f.is_abstract}
        self.names = {str(f.func.name) for f in functions}
        self.derived = derivative_signatures(os.path.join(self.tc.autograd_dir, "derivatives.yaml"), bases)
        gaps = self.autograd_gaps([f for f, w, v in zip(functions, written, views, strict=True)
                                   if w and not v and not f.func.returns and f.func.kind().name in _GAP_KINDS]
                                  if self.autograd else [])
        none = (Gap.NONE, "", ())
        return [self.one(f, reg, w, v, raw)._replace(autograd_gap=g[0], grad_name=g[1], grad_inputs=g[2])
                for f, reg, w, v in zip(functions, registers, written, views, strict=True)
                for g in (gaps.get(str(f.func.name), none),)]

    def autograd_gaps(self, functions: list) -> dict[str, tuple[Gap, str, tuple[str, ...]]]:
        """Ask the tree's own ``gen_variable_type`` for the VariableType kernel of each void
        out= / in-place function, and read what it emits: an out= kernel with a differentiable
        input (torchgen's ``is_differentiable``) but no ``throw_error_out_requires_grad`` lets
        inputs that require grad through silently (``Gap.OUT``); an in-place kernel without
        ``check_inplace`` lets a leaf that requires grad be written (``Gap.INPLACE``). The text the
        codegen writes decides, never its rule re-derived: a codegen that ``diff --mode fix``
        patched answers differently. For an out= op also the name PyTorch's own refusal prints
        (the codegen's ``get_base_name``: ``add`` for add.out) and its differentiable inputs."""
        if not functions:
            return {}
        gvt = _import(self.tc, f"{self.tc.autograd}.gen_variable_type")
        api = _import(self.tc, "torchgen.api.autograd")
        out = {}
        for fn in api.match_differentiability_info(functions, self.gap_infos()):
            f = fn.func
            if api.dispatch_strategy(fn) != "use_derived":  # no VariableType kernel of its own: it decomposes
                continue
            try:
                written = gvt.gen_variable_type_func(fn)
            except (AssertionError, RuntimeError):  # the codegen itself refuses this op with this yaml (a
                continue  # foreach op of a partial yaml lacks the formula of its reference op): nothing to read
            body = "".join(line for k, v in written.items() if k.startswith("type_derived_method_definitions")
                           for line in v)
            kind = Kind(f.func.kind().name)
            inputs = self.differentiable_inputs(fn)
            if kind == Kind.OUT and "throw_error_out_requires_grad" not in body and inputs:
                out[str(f.func.name)] = (Gap.OUT, str(gvt.get_base_name(f)), inputs)
            elif kind == Kind.INPLACE and "check_inplace" not in body:
                out[str(f.func.name)] = (Gap.INPLACE, "", ())
        return out

    def gap_infos(self):
        """The differentiability infos, as the tree's codegen loads them. A yaml that is a part of
        PyTorch's (a fixture, an extension's few ops) lacks functions that derivatives.yaml names,
        which load_derivatives refuses: it is then asked again with the entries of this yaml's own
        functions only."""
        path = os.path.join(self.tc.autograd_dir, "derivatives.yaml")
        try:
            return self.infos()
        except InputError:
            with open(path, encoding="utf-8") as fh:
                blocks = re.split(r"(?m)^(?=- name:)", fh.read())
        kept = [b for b in blocks[1:] if _name_of(b) in self.names]
        if len(kept) == len(blocks) - 1:  # every entry is of this yaml: the whole file's refusal stands
            return self.infos()
        if not kept:  # none of this yaml's functions has a derivative formula
            return {}
        import tempfile

        ld = _import(self.tc, f"{self.tc.autograd}.load_derivatives")
        with tempfile.TemporaryDirectory(prefix="torchgen-patch-") as d:
            part = os.path.join(d, "derivatives.yaml")
            with open(part, "w", encoding="utf-8") as fh:
                fh.write(blocks[0] + "".join(kept))
            try:
                with self._parse_shared():
                    return ld.load_derivatives(part, self.native_path, self.tags_path)[0]
            except Exception as e:  # noqa: BLE001 — the autograd codegen's own checks, whatever they raise
                raise rejected(self.tc, path, e, who="autograd codegen") from None
            finally:
                getattr(ld, "_GLOBAL_LOAD_DERIVATIVE_CACHE", {}).pop((part, self.native_path), None)

    def differentiable_inputs(self, fn) -> tuple[str, ...]:
        """The non-out arguments torchgen's ``is_differentiable`` calls differentiable (under any
        of the op's differentiability infos), in schema order."""
        is_diff = _import(self.tc, "torchgen.api.autograd").is_differentiable
        infos = list(fn.info.values()) if fn.info else [None]
        return tuple(a.name for a in fn.func.func.arguments.flat_non_out
                     if any(is_diff(a.name, a.type, info) for info in infos))

    def one(self, f, reg: bool, written: tuple, view: bool, raw: dict[int, str]) -> Facts:
        name = str(f.func.name)
        kind = Kind(f.func.kind().name)
        generates = reg and self.uses_derived(f)
        candidate = kernel_candidate(kind, written, len(f.func.returns), view)
        text = raw.get(f.loc.line)
        schema = f"aten::{text}" if text is not None and text.startswith(f"{name}(") else f"aten::{f.func}"
        return Facts(
            name=f"aten::{name}", schema=schema, file=f.loc.file, line=f.loc.line, kind=kind, written=written,
            returns=len(f.func.returns), view=view, generates=generates,
            composite_implicit=not f.is_abstract, manual=self.is_manual(f),
            cpp=cpp_signature(f) if candidate else None)

    def registers(self, f) -> bool:
        """The codegen's own ``inplace_or_view_method_registration``: does it register a kernel?
        Asked for every function that writes an argument or is a view (what an ADInplaceOrView
        kernel exists for); never the codegen's own rule re-derived, which differs between an
        unpatched codegen and one ``diff --mode fix`` patched."""
        reg = self.g.inplace_or_view_method_registration
        # The undecorated function: the decision needs no native_function_manager
        # context, and entering one per function is half the cost of a cold scan.
        reg = getattr(reg, "__wrapped__", reg)
        return reg(self.NFWDI(func=f, info=None, fw_derivatives=None)) is not None

    def uses_derived(self, f) -> bool:
        """The codegen's own ``use_derived`` (which also drops MANUAL_AUTOGRAD ops).
        Differentiability infos matter only for non-abstract functions; they are
        loaded only when such a function's signature is in derivatives.yaml."""
        info = None
        if not f.is_abstract and ("*" in self.derived or str(f.func.signature()) in self.derived):
            info = self.infos().get(f.func)
        return bool(self.g.use_derived(self.NFWDI(func=f, info=info, fw_derivatives=None)))

    def infos(self):
        if self._infos is None:
            ld = _import(self.tc, f"{self.tc.autograd}.load_derivatives")
            path = os.path.join(self.tc.autograd_dir, "derivatives.yaml")
            try:
                with self._parse_shared():
                    self._infos, _ = ld.load_derivatives(path, self.native_path, self.tags_path)
            except Exception as e:  # noqa: BLE001 — the autograd codegen's checks of derivatives.yaml
                raise rejected(self.tc, path, e, who="autograd codegen") from None
            finally:  # keyed by path: a file edited later in this process must be read again
                getattr(ld, "_GLOBAL_LOAD_DERIVATIVE_CACHE", {}).pop((path, self.native_path), None)
        return self._infos

    @contextlib.contextmanager
    def _parse_shared(self):
        """load_derivatives parses the yaml again through torchgen's parse_native_yaml, whose cache
        (by path) is given this scan's own parse of the same text for the call: the same result,
        once instead of twice (about a second). Emptied after, so an edited file is parsed afresh."""
        cache: Any = getattr(_import(self.tc, "torchgen.gen"), "_GLOBAL_PARSE_NATIVE_YAML_CACHE", None)
        seeded = isinstance(cache, dict) and self.parsed is not None and self.native_path not in cache
        if seeded:
            cache[self.native_path] = self.parsed
        try:
            yield
        finally:
            if seeded:
                cache.pop(self.native_path, None)

    def is_manual(self, f) -> bool:
        if str(f.func.name.name.base) not in self.manual_bases:  # cheap pre-filter by base name
            return False
        return self.cpp.name(f.func) in self.manual


def _form(t) -> Form:
    """How a written argument of type ``t`` is passed. torchgen's schema parser puts a write annotation
    on ``Tensor``, ``Tensor[]`` and ``Tensor?`` only; any other type is a torchgen of another shape."""
    from torchgen.model import BaseTy, BaseType, ListType, OptionalType

    if isinstance(t, BaseType) and t.name == BaseTy.Tensor:
        return Form.TENSOR
    if isinstance(t, ListType) and isinstance(t.elem, BaseType) and t.elem.name == BaseTy.Tensor:
        return Form.TENSOR_LIST
    if isinstance(t, OptionalType) and isinstance(t.elem, BaseType) and t.elem.name == BaseTy.Tensor:
        return Form.OPTIONAL_TENSOR
    if isinstance(t, ListType) and isinstance(t.elem, OptionalType):
        return Form.OPTIONAL_TENSOR_LIST
    raise TypeError(f"a written argument of type {t}")


def derivative_signatures(path: str, bases: set[str] | None = None) -> frozenset[str]:
    """Signatures of the schemas derivatives.yaml names (a cheap pre-filter).

    The autograd codegen attaches a DifferentiabilityInfo to every function
    whose signature equals that of a derivatives.yaml entry; a function whose
    signature matches none has no info, so the full (slow) load_derivatives is
    needed only when a match exists.
    """
    from torchgen.model import FunctionSchema

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return frozenset()
    sigs = set()
    for m in re.finditer(r"^- name: *(.+?)\s*$", text, re.M):
        if bases is not None and m.group(1).split("(", 1)[0].split(".", 1)[0] not in bases:
            continue
        try:
            sigs.add(str(FunctionSchema.parse(m.group(1)).signature()))
        except Exception:  # noqa: BLE001 — an entry this torchgen cannot parse: let load_derivatives judge
            sigs.add("*")
    return frozenset(sigs)


def _name_of(block: str) -> str:
    """The operator name of one derivatives.yaml entry (``- name: add.Tensor(...`` -> ``add.Tensor``)."""
    return block[len("- name:"):].split("(", 1)[0].strip()


def cpp_signature(f) -> CppSig:
    """The dispatcher signature of ``f`` in C++ terms, as torchgen's C++ API spells it."""
    from torchgen.api.types import DispatcherSignature
    from torchgen.context import native_function_manager

    with native_function_manager(f):
        sig = DispatcherSignature.from_schema(f.func)
        formals = tuple((a.type, a.name) for a in sig.arguments())
        names = tuple(e.expr for e in sig.exprs())
    return CppSig(formals, names, f.func.name.unambiguous_name(), f.root_name)


class _Entry(NamedTuple):
    """What ``cpp_signature`` reads of a NativeFunction: its schema, where it is, and the two fields of
    its yaml entry that decide its C++ types (torchgen's native_function_manager)."""

    func: Any  # torchgen's FunctionSchema
    loc: object
    use_const_ref_for_mutable_tensors: bool
    part_of_structured_group: bool

    @property
    def root_name(self) -> str:
        return self.func.name.name.base


def cpp_signatures(tc: Toolchain, native_path: str, native_text: str, wanted, identity: str | None = None) \
        -> dict[str, CppSig]:
    """The C++ signatures a scan makes for ``wanted`` ((op, schema, yaml line) each), made again by the
    same function (``cpp_signature``, torchgen's C++ API) from each schema and its yaml entry's
    ``use_const_ref_for_mutable_tensors`` and ``structured``/``structured_delegate`` (a function
    torchgen generates from an entry, an autogen'd ``.out`` say, has the entry's first and neither of
    the others, as torchgen's own generation gives it). A cached scan's signatures are used only
    when they are these. ValueError when a schema or entry cannot be read back."""
    lines = native_text.splitlines(keepends=True)
    with imported(tc, identity):
        model = _import(tc, "torchgen.model")
        out = {}
        for op, schema, line in wanted:
            if not (isinstance(line, int) and 0 < line <= len(lines)) or "::" not in schema:
                raise ValueError(f"{op}: no yaml entry at line {line}")
            entry = _entry_at(tc, native_path, lines, line)
            try:
                func = model.FunctionSchema.parse(schema.split("::", 1)[1])
            except Exception as e:  # noqa: BLE001 — torchgen's parser raises bare AssertionErrors
                raise ValueError(f"{op}: schema does not parse ({type(e).__name__})") from None
            own = str(entry.get("func", "")).split("(", 1)[0].strip() == str(func.name)
            structured = own and (entry.get("structured") is True or entry.get("structured_delegate") is not None)
            f = _Entry(func, model.Location(native_path, line),
                       entry.get("use_const_ref_for_mutable_tensors") is True, structured)
            out[op] = cpp_signature(f)
        return out


def _entry_at(tc: Toolchain, path: str, lines: list[str], line: int) -> dict:
    """The yaml entry that starts at ``line`` (its block, up to the next entry), read as a whole file
    is (the toolchain's bounded loader, no aliases, bounded depth)."""
    end = line
    while end < len(lines) and not lines[end].startswith("- "):
        end += 1
    block = "".join(lines[line - 1:end])
    try:
        es = load_yaml_list(tc, path, block, "native_functions.yaml")
    except InputError as e:
        raise ValueError(f"the yaml entry at line {line} does not read back: {e.message}") from None
    if len(es) != 1:
        raise ValueError(f"no single yaml entry at line {line}")
    return es[0]
