"""The one module that talks to torchgen.

Everything torchgen-specific (where the packaged yaml lives, how it is parsed,
the upstream autograd codegen's rule for emitting ADInplaceOrView kernels, the
C++ types of a dispatcher signature) goes through here, so a torchgen change
touches this file only. Nothing here imports torch itself.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass



from .errors import InputError, one_line


def torchgen_dir() -> str:
    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(None, None, "torchgen is not importable", "install torch (it ships torchgen)")
    return list(spec.submodule_search_locations)[0]


def packaged_yaml() -> tuple[str, str]:
    """native_functions.yaml and tags.yaml as shipped inside the installed torchgen."""
    d = os.path.join(torchgen_dir(), "packaged", "ATen", "native")
    return os.path.join(d, "native_functions.yaml"), os.path.join(d, "tags.yaml")


def packaged_autograd_dir() -> str:
    return os.path.join(torchgen_dir(), "packaged", "autograd")


def read_text(path: str, what: str) -> str:
    if not os.path.exists(path):
        raise InputError(path, None, f"{what} not found")
    if os.path.isdir(path):
        raise InputError(path, None, f"{what} is a directory, expected a file")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise InputError(path, None, f"cannot read {what}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InputError(path, line, f"{what} is not valid UTF-8 (byte 0x{data[e.start]:02x})") from None


def load_yaml_list(path: str, text: str, what: str) -> list:
    import yaml
    from torchgen.gen import LineLoader

    try:
        es = yaml.load(text, Loader=LineLoader)
    except yaml.YAMLError as e:
        raise yaml_error(path, text, e) from None
    except AssertionError as e:  # torchgen's loader refuses duplicate keys this way
        m = re.search(r"key=(.*?), line=(\d+)", str(e))
        line = int(m.group(2)) + 1 if m else None
        what = f"duplicate key '{m.group(1)}'" if m else one_line(e)
        raise InputError(path, line, f"malformed YAML: {what}") from None
    if not isinstance(es, list) or not es:
        raise InputError(path, 1, f"{what} must be a non-empty YAML list of entries")
    for e in es:
        if not isinstance(e, dict):
            raise InputError(path, 1, f"{what}: every entry must be a mapping, got {type(e).__name__}")
    return es


def yaml_error(path: str, text: str, e) -> InputError:
    """A PyYAML error as an InputError at its line (MarkedYAMLError or ReaderError)."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        return InputError(path, mark.line + 1 if mark else None, f"malformed YAML: {e.problem or e.context}")
    if isinstance(e, yaml.reader.ReaderError):
        line = text.count("\n", 0, e.position) + 1 if isinstance(e.position, int) else None
        return InputError(path, line, f"malformed YAML: {e.reason} (character {e.character!r})")
    return InputError(path, None, f"malformed YAML: {one_line(e)}")


_LOC = re.compile(r"in (?P<path>.+?):(?P<line>\d+):")


def _torchgen_error(path: str, exc: BaseException, es: list | None = None) -> InputError:
    msg = str(exc.args[0]) if exc.args else type(exc).__name__
    m = _LOC.search(msg)
    line = int(m.group("line")) if m else _line_of_named_entry(msg, es or [])
    first = one_line(msg)
    if first.startswith("in ") and _LOC.match(first):
        first = type(exc).__name__
    return InputError(path, line, f"torchgen rejected this file: {first}",
                      "is the yaml from a torch release this torchgen can read?")


def parse(native_path: str, tags_path: str, native_text: str, tags_text: str) -> tuple[list, dict[int, str]]:
    """Parse both files through torchgen; return its NativeFunctions (with
    generated ones added, as torchgen's own codegen does) and the raw func
    text of each yaml line (see ``schema_str``)."""
    from torchgen.gen import parse_native_yaml_struct, parse_tags_yaml_struct

    tag_es = load_yaml_list(tags_path, tags_text, "tags.yaml")
    try:
        tags = parse_tags_yaml_struct(tag_es, path=tags_path)
    except Exception as e:  # torchgen raises bare AssertionError/KeyError
        raise _torchgen_error(tags_path, e) from None
    es = load_yaml_list(native_path, native_text, "native_functions.yaml")
    _check_duplicates(native_path, es)
    try:
        parsed = parse_native_yaml_struct(es, tags, path=native_path)
    except Exception as e:
        raise _torchgen_error(native_path, e, es) from None
    return list(parsed.native_functions), {e["__line__"]: e["func"].strip() for e in es}


def _line_of_named_entry(msg: str, es: list) -> int | None:
    """torchgen's cross-entry checks name the schema but not its line: find it."""
    for e in es:
        func = e.get("func")
        if isinstance(func, str) and func.strip() in msg:
            return e.get("__line__")
    return None


def _check_duplicates(path: str, es: list) -> None:
    seen: dict[str, int] = {}
    for e in es:
        func = e.get("func")
        if not isinstance(func, str):
            raise InputError(path, e.get("__line__"), "entry has no 'func:' schema string")
        name = func.split("(", 1)[0].strip()
        line = e.get("__line__")
        if name in seen:
            raise InputError(path, line, f"duplicate operator '{name}'", f"first defined at line {seen[name]}")
        seen[name] = line


# ---------------------------------------------------------------------------
# Facts about one NativeFunction


def op_name(f) -> str:
    return f"aten::{f.func.name}"


def schema_str(f, raw: dict[int, str] | None = None, name: str | None = None) -> str:
    """``aten::`` + the schema. ``raw`` maps a yaml line to the yaml's own func
    text, which torchgen guarantees round-trips (it asserts
    str(parse(text)) == text), so it is used instead of re-printing; functions
    torchgen generates share their source's line, hence the name check.
    ``name``: str(f.func.name), when the caller has it."""
    text = raw.get(f.loc.line) if raw else None
    if text is not None and text.startswith(f"{name or f.func.name}("):
        return f"aten::{text}"
    return f"aten::{f.func}"


def kind(f) -> str:
    """'functional' | 'inplace' | 'out' | 'mutable' | 'scratch', as torchgen names them."""
    return f.func.kind().name


def written_args(f) -> tuple:
    """The arguments the schema marks as written (alias annotation with '!'),
    as model.WrittenArg (their C++ names in the dispatcher signature, and form)."""
    from .model import WrittenArg

    return tuple(WrittenArg(a.name, _form(a.type)) for a in f.func.arguments.flat_all
                 if a.annotation is not None and a.annotation.is_write)


def _form(t) -> str:
    from torchgen.model import BaseTy, BaseType, ListType, OptionalType

    if isinstance(t, BaseType) and t.name == BaseTy.Tensor:
        return "tensor"
    if isinstance(t, ListType) and isinstance(t.elem, BaseType) and t.elem.name == BaseTy.Tensor:
        return "tensor_list"
    if isinstance(t, OptionalType) and isinstance(t.elem, BaseType) and t.elem.name == BaseTy.Tensor:
        return "optional_tensor"
    if isinstance(t, ListType) and isinstance(t.elem, OptionalType):
        return "optional_tensor_list"
    return f"unsupported type {t}"


def returns_nothing(f) -> bool:
    return len(f.func.returns) == 0


@functools.cache
def _upstream():
    """The installed autograd codegen's own module, or None if it is not shipped."""
    try:
        from torchgen.packaged.autograd import gen_inplace_or_view_type as g
        from torchgen.packaged.autograd import gen_trace_type as t
    except Exception:  # an exotic build without the packaged autograd codegen
        return None
    return g, t


def is_view(f) -> bool:
    up = _upstream()
    if up is None:
        return False
    return up[0].get_view_info(f) is not None


@functools.cache
def _manual_bases() -> frozenset[str]:
    up = _upstream()
    return frozenset(m.rstrip("_") for m in up[1].MANUAL_AUTOGRAD) if up else frozenset()


def is_manual_autograd(f) -> bool:
    """Is ``f`` in the codegen's MANUAL_AUTOGRAD set (kernels written by hand)?"""
    if str(f.func.name.name.base) not in _manual_bases():  # cheap pre-filter by base name
        return False
    from torchgen.api import cpp

    return cpp.name(f.func) in _upstream()[1].MANUAL_AUTOGRAD


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
        except Exception:  # an entry this torchgen cannot parse: let load_derivatives judge
            sigs.add("*")
    return frozenset(sigs)


def upstream_registers(f) -> bool | None:
    """Would the installed autograd codegen register an ADInplaceOrView kernel
    for ``f`` (its own ``inplace_or_view_method_registration``)? ``None`` if the
    codegen is not shipped. This part does not depend on derivatives."""
    up = _upstream()
    if up is None:
        return None
    from torchgen.api.autograd import NativeFunctionWithDifferentiabilityInfo as NFWDI

    g = up[0]
    if g.get_view_info(f) is None and not g.modifies_arguments(f):
        return False  # the codegen's own first test; skips building a registration string
    reg = g.inplace_or_view_method_registration
    # The undecorated function: the decision needs no native_function_manager
    # context, and entering one per function is half the cost of a cold scan.
    reg = getattr(reg, "__wrapped__", reg)
    return reg(NFWDI(func=f, info=None, fw_derivatives=None)) is not None


def upstream_uses_derived(f, derived: frozenset[str], infos) -> bool:
    """The codegen's own ``use_derived`` (which also drops MANUAL_AUTOGRAD ops).

    Differentiability infos matter only for non-abstract functions; they are
    loaded (``infos()``) only when such a function's signature is in ``derived``.
    """
    g = _upstream()[0]
    from torchgen.api.autograd import NativeFunctionWithDifferentiabilityInfo as NFWDI

    info = None
    if not f.is_abstract and ("*" in derived or str(f.func.signature()) in derived):
        info = infos().get(f.func)
    return bool(g.use_derived(NFWDI(func=f, info=info, fw_derivatives=None)))


def load_infos(native_path: str, tags_path: str):
    from torchgen.packaged.autograd.load_derivatives import load_derivatives

    try:
        d, _ = load_derivatives(os.path.join(packaged_autograd_dir(), "derivatives.yaml"), native_path, tags_path)
    except Exception as e:  # the autograd codegen's own checks of the yaml
        err = _torchgen_error(native_path, e)
        err.message = err.message.replace("torchgen rejected", "the autograd codegen rejected")
        raise InputError(err.path, err.line, err.message, err.hint) from None
    return d


# ---------------------------------------------------------------------------
# C++ pieces for the codegen (types from torchgen's C++ API)


@dataclass(frozen=True)
class CppSignature:
    formals: list[tuple[str, str]]  # (C++ type, name), schema order, without the keyset
    arg_names: list[str]  # names to pass to redispatch, schema order
    unambiguous_name: str  # at::_ops::<this>
    root_name: str  # ATen/ops/<this>_ops.h


def cpp_signature(f) -> CppSignature:
    from torchgen.api.types import DispatcherSignature
    from torchgen.context import native_function_manager

    with native_function_manager(f):
        sig = DispatcherSignature.from_schema(f.func)
        args = sig.arguments()
        formals = [(a.type, a.name) for a in args]
        names = [e.expr for e in sig.exprs()]
    return CppSignature(formals, names, f.func.name.unambiguous_name(), f.root_name)
