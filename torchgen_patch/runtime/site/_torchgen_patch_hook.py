"""torchgen-patch's hook in a Python process: loaded at interpreter start by ``run``'s ``sitecustomize`` (this folder
first on PYTHONPATH) or by the ``.pth`` file ``torchgen-patch enable`` writes into an environment's site-packages.
Standard library only, and at start nothing but what the interpreter has loaded already: the rest waits for the first
``import torch``, and so do the hook's two parts, files beside it loaded by their path (``_part``):
``_torchgen_patch_spec.py`` (an enabled environment's data file, why a process has no launch spec) at that import,
``_torchgen_patch_spawn.py`` (the processes this one starts) at the first process it starts.

- A meta-path finder lets the other finders find ``torch`` (and the ``--import`` modules), then
  wraps that one loader's ``exec_module`` so the kernels are installed right after the module ran.
- An audit hook (``sys.addaudithook``: it cannot be removed) puts the finder back in front when the
  program reset ``sys.meta_path`` or put a finder of its own first, and installs the kernels at the
  next import when torch came in past the finder (``importlib.import_module`` raises no audit event
  of its own). Under ``run`` it also hands the processes this one starts (``subprocess``, ``os.exec*``,
  ``os.posix_spawn``, ``os.system``) to the spawn part, which names a Python child that drops the hook.
- The tool's own imports in the program's process and the parts' (``_Own``) never come from the program's own
  directory, PYTHONPATH or a launch spec, and leave ``sys.path`` and the program's view of ``sys.modules`` as they were.
"""

import _thread
import os
import sys

NAME = "_torchgen_patch_hook"
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # the sys.path entry of this hook's torchgen_patch
ENV = "TORCHGEN_PATCH_RUN"
HINT = "torchgen-patch enable patches every Python process of an environment"
SPEC, SPAWN = "_torchgen_patch_spec", "_torchgen_patch_spawn"  # the hook's two parts: files beside it
_SPAWN = ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.system")
_EVENTS = frozenset(("import", *_SPAWN))
_PathFinder = sys.modules["_frozen_importlib_external"].PathFinder  # importlib.machinery's, loaded at start
_STD_FINDERS = (sys.modules["_frozen_importlib"].BuiltinImporter, sys.modules["_frozen_importlib"].FrozenImporter)

_spec = None  # the launch spec's text: run's $TORCHGEN_PATCH_RUN, or what enable wrote
_value = None  # that text as the tool parsed it (a LaunchSpec), once torch has been imported
_source = "$" + ENV  # where it came from, for messages
_mode = None  # "run" | "enable"; None until start()
_down = False  # the tool itself runs in this process (its CLI): it installs nothing behind its back
_finished = False  # everything installed (or refused, said so): the audit hook only watches children
_enabled_here = False  # the .pth of an enabled environment loaded this hook
_start_path: tuple[str, ...] = ()  # sys.path at the hook's start: an entry put first later is the program's dir
_broken = None  # why an enabled environment's data file cannot be its launch spec (said at `import torch`)
_lazy = None  # that data file, not read yet
_data = None  # (its text, _broken, its path) where $TORCHGEN_PATCH_RUN is set as well: the tool decides which governs
_lock = _thread.allocate_lock()
_busy: set[int] = set()  # threads doing the tool's own work right now
_pending: list[str] = []  # modules finished importing, not yet handed to the tool
_parts: dict = {}  # name -> the hook's part of that name, or None where it cannot be had (said once)
_std_dirs: list[str] = []  # the standard library's directories on sys.path, once known


def start(spec_text, mode, source=None):
    """Start watching (once per process; ``run`` after ``enable``: run's spec governs)."""
    global _spec, _value, _mode, _source, _start_path, _enabled_here  # noqa: PLW0603 (the hook's state, one a process)
    if _mode is not None:
        if mode == "run" and spec_text:
            _spec, _value, _mode, _source = spec_text, None, "run", "$" + ENV
        return
    _enabled_here = mode == "enable"
    run_spec = os.environ.get(ENV)
    if run_spec:  # started by run, whatever else happened to its PYTHONPATH
        _spec, _mode, _source = run_spec, mode, "$" + ENV
    else:
        _spec, _mode, _source = spec_text, mode, source or "$" + ENV
    _start_path = tuple(sys.path)
    _Watch.watched = {m for m in _watched() if m not in sys.modules}
    if "torch" in sys.modules:  # imported before site ran (an embedding program): install now
        _after("torch")
    if _Watch.watched:
        sys.meta_path.insert(0, _Watch)
    sys.addaudithook(_audit)
    import atexit

    atexit.register(_at_exit)


def enabled(data):
    """The start of a process of an enabled environment (its ``.pth`` line calls this): the launch spec
    is the file ``data`` beside that line, read (by the spec part) once torch has been imported: a process
    that never imports torch reads nothing, and one whose file cannot be the spec says so in one line at
    that import and goes on unpatched. (Its spec has no --import modules: only torch is watched.)"""
    global _lazy  # noqa: PLW0603 (the hook's state, one per process)
    _lazy = data  # read even where $TORCHGEN_PATCH_RUN is set: that variable may not ask for less, nor choose code
    start(None, "enable", data)


def stand_down():
    """The tool's own command line runs in this process: leave its torch alone."""
    global _down  # noqa: PLW0603 (the hook's state, one per process)
    _down = True


def _watched():
    """torch, and the modules of --import (their operators exist once they finished importing). Only
    a spec of ``run`` names any (an enabled environment's has none, and its file is not read at start)."""
    imports = _early("imports") if _spec is not None else None
    return {"torch", *(m for m in imports if isinstance(m, str))} if isinstance(imports, list) else {"torch"}


def _early(field):
    """A field of the launch spec the hook needs before the tool's own parse (``LaunchSpec.parse``) can run, or where
    the tool failed to load (``imports`` at start, ``strict``), by the standard library's JSON decoder; None where the
    text is no JSON object (the tool's parse says what is wrong). No field chooses where the tool comes from."""
    try:
        data = std_module("json").loads(_spec)
    except (ValueError, TypeError, RecursionError):
        return None
    return data.get(field) if isinstance(data, dict) else None


def _say(text):
    """One line on stderr, wherever the program sent it: nothing where it is closed or broken (never stdout)."""
    err = sys.stderr
    if err is None:
        return
    try:
        err.write(text + "\n")
        flush = getattr(err, "flush", None)
        if flush is not None:
            flush()
    except Exception:  # noqa: BLE001 — a broken sink is the program's; its import goes on
        pass


class _Watch:
    """A meta-path finder that answers for the watched modules only: it lets the other finders find
    the module, then wraps that loader's exec_module (on this one loader object, for this one module)
    to call _after once the module has run. A spec asked for and thrown away
    (importlib.util.find_spec("torch"), as libraries do to see whether torch is there) leaves the
    module watched."""

    watched: set[str] = set()

    @classmethod
    def _ran(cls, name):
        cls.watched.discard(name)
        if not cls.watched and cls in sys.meta_path:
            sys.meta_path.remove(cls)

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in cls.watched or _down:
            return None
        for finder in list(sys.meta_path):
            find = None if finder is cls else getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run_module = getattr(loader, "exec_module", None)
        if run_module is None:
            return spec  # cannot be watched: the audit hook installs at the next import
        wrapped = getattr(run_module, "_torchgen_patch_of", None)  # one loader object for several modules

        def exec_module(module):
            if getattr(module, "__name__", None) != name:
                return (wrapped or run_module)(module)
            try:
                loader.exec_module = wrapped or run_module
            except AttributeError:
                pass
            (wrapped or run_module)(module)
            cls._ran(name)
            _after(name)

        exec_module._torchgen_patch_of = wrapped or run_module  # type: ignore[attr-defined]  # a mark on the function
        try:
            loader.exec_module = exec_module
        except AttributeError:  # a loader that takes no attributes: the audit hook installs at the next import
            pass
        return spec


def _audit(event, args):
    """Every audited event of the process (a file opened, ...): returns at once for all but a few (0.25 us an event)."""
    if event not in _EVENTS or _down:
        return
    if event == "import":
        if _Watch.watched and not _finished and _thread.get_ident() not in _busy:
            _on_import(args[0])
    elif event in _SPAWN and _mode == "run":
        if event == "os.posix_spawn" and sys._getframe(1).f_code.co_name == "_posix_spawn":
            return  # subprocess.Popen's own way of starting the child it raised its event for
        try:
            spawn = _part(SPAWN, f"NOT watching the processes pid {os.getpid()} starts")
            line = spawn and spawn.on_spawn(event, args, enabled=_enabled_here, stdlib=_stdlib_dirs(), std=std_module,
                                            ours=globals(), hint=HINT)
            if line:
                _say(line)
        except Exception:  # noqa: BLE001 — never stop the program starting its process
            pass


def _on_import(name):
    meta = sys.meta_path
    if name in _Watch.watched and (not meta or meta[0] is not _Watch):
        try:  # the program reset sys.meta_path, or put its own finder first: ours goes first again
            while _Watch in meta:
                meta.remove(_Watch)
            meta.insert(0, _Watch)
        except Exception:  # noqa: BLE001 — not a list any more: the next check still installs
            pass
    for done in [m for m in _Watch.watched if m in sys.modules and not _initializing(m)]:
        _Watch._ran(done)  # imported past the finder: install now
        _after(done)


def _at_exit():
    """torch came in past the finder and nothing was imported after it: too late to install, not to say so."""
    if not _down and not _finished and "torch" in _Watch.watched and "torch" in sys.modules:
        _say(f"torchgen-patch: NOT active in pid {os.getpid()}: torch was imported where the hook could not see "
             "it finish (importlib.import_module past a replaced sys.meta_path?), and nothing was imported after "
             "it (hint: import torch with an import statement, or call torchgen_patch.install() after importing it)")


def _initializing(name):
    m = sys.modules.get(name)
    return m is not None and getattr(getattr(m, "__spec__", None), "_initializing", False)


def _after(name):
    """The module ``name`` finished importing: let the tool install what it can now, inside _Own.
    Never waits for another thread doing this work (it could hold a lock this thread's import
    holds): the name is queued, and whichever thread holds the work does every name queued."""
    _pending.append(name)
    ident = _thread.get_ident()
    while _pending and not _down and not _finished and ident not in _busy:
        if not _lock.acquire(False):
            return
        _busy.add(ident)
        try:
            while _pending and not _finished:
                _work(_pending.pop(0))
        finally:
            _busy.discard(ident)
            _lock.release()


def _work(name):
    global _finished  # noqa: PLW0603 (the hook's state, one per process)
    try:
        spec = _launch_spec()
        if spec is None:
            return
        with _Own({**spec.roots, "torchgen_patch": PACKAGE}):  # the tool from where this hook is, whatever a spec says
            from torchgen_patch.runtime.launch.process import after_import

            outcome = after_import(name, spec, _mode, program_import)  # type: ignore[arg-type]  # start() set _mode
        _finished = outcome.done
        if outcome.line:
            _say(outcome.line)
        if outcome.exit_code is not None:
            _exit(outcome.exit_code)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 — the tool cannot load: the program goes on unpatched, and says so
        _finished = True
        _say(f"torchgen-patch: NOT active in pid {os.getpid()}: {type(e).__name__}: {e}")
        if _mode == "enable" and _strict():
            _exit(3)  # enable --strict: a process that cannot have the kernels stops, whatever the cause


def _strict():
    """Whether the launch spec says ``strict`` (an enabled environment's processes never run unpatched); a spec that
    cannot be read, or one from the environment's variables, says not."""
    return _value.strict if _value is not None else _early("strict") is True and not _source.startswith("$")


def _launch_spec():
    """The launch spec as the tool parses it (``LaunchSpec.parse``, the tool imported from where this hook is), once per
    process; None where there is none to use, said in one line: a spec of ``run`` that is not one stops the process
    (exit 2), as every bad input does; an enabled environment's file that is not one leaves the program unpatched (as
    when it names what cannot be had). In an enabled environment with $TORCHGEN_PATCH_RUN set too, the tool decides
    which of the two governs (``process.governing``): where the file does, it is the mode and source from then on."""
    global _finished, _spec, _value, _broken, _lazy, _data, _mode, _source  # noqa: PLW0603 (the hook's state)
    if _value is not None:
        return _value
    part = _part(SPEC, f"NOT active in pid {os.getpid()}")
    if part is None:  # said; the data file is not read, so strict is unknown: never exit 3 for it (fail open)
        _finished = True
        return None
    if _lazy is not None:
        text, why = part.read_data(_lazy)
        if _source.startswith("$"):
            _data = (text, why, _lazy)
        else:
            _spec, _broken = text, why
        _lazy = None
    why = part.unusable(_spec, _broken, _source, from_file=_mode == "enable" and not _source.startswith("$"), hint=HINT)
    if why is not None:  # a damaged data file: what it would have said, strict included, is unknown
        _finished = True
        _say(f"torchgen-patch: NOT active in pid {os.getpid()}: {why}")
        return None
    with _Own({"torchgen_patch": PACKAGE}):  # the package and the stdlib only
        from torchgen_patch.runtime.launch.process import read

        _value, refused = read(_spec, str(_mode), _source, _data, isolated=bool(sys.flags.ignore_environment))
    if refused is not None:
        _finished = refused.done
        if not _finished:  # the environment's own file governs, said once
            _mode, _source = "enable", _data[2]  # type: ignore[index]  # refused only where _data is set
        if refused.line:
            _say(refused.line)
        if refused.exit_code is not None:
            _exit(refused.exit_code)
    return _value


def _exit(code):
    """Stop the process: the kernels cannot be had, and it must not go on unpatched."""
    threading = std_module("threading")
    if threading.current_thread() is not threading.main_thread():
        os._exit(code)  # SystemExit would end this thread only, and the program go on unpatched
    raise SystemExit(code)


class _Own:
    """The tool's own imports, in this thread, while the block runs: its package and dependencies
    (``roots``: name -> directory) from where the tool is installed, a module of the standard library's
    name from the standard library (``_std_spec``), every other top-level module from the program's
    path less its own directory (the script's folder, the current directory); modules of those names
    the program imported from elsewhere (a ``hmac.py`` beside it, first on PYTHONPATH) are out of sight
    meanwhile. Afterwards a module the tool imported stays in ``sys.modules`` only where the program's
    own import would find that same file, so the program imports what it imported before."""

    _kept: dict = {}  # the tool's modules the program could not have imported: the next block uses them again
    active = None  # the block running now

    def __init__(self, roots):
        self.roots = roots

    def __enter__(self):
        self.outer, _Own.active = _Own.active, self
        self.finder = _PathFinder
        self.thread: int | None = _thread.get_ident()
        self.own = {"", "."}
        if sys.path and sys.path[0] not in _start_path:
            self.own.add(sys.path[0])
        self.hidden = {}
        for n, m in list(sys.modules.items()):
            top = n.partition(".")[0]
            if top in self.roots and top != "torchgen_patch" and not _under(m, self.roots[top]) or \
                    top in sys.stdlib_module_names and top not in self.roots and _planted(m):
                self.hidden[n] = sys.modules.pop(n)
        self.before = set(sys.modules)
        for n, m in self._kept.items():
            sys.modules.setdefault(n, m)
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc):
        import importlib.util  # while the block's routing holds: the standard library's

        _Own.active = self.outer
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for top in sorted(n for n in set(sys.modules) - self.before if "." not in n):
            if top in ("torch", "torchgen_patch"):
                continue
            module = sys.modules[top]
            saved = sys.modules.pop(top)
            try:
                theirs = importlib.util.find_spec(top)
            except Exception:  # noqa: BLE001 — a finder that fails: the module counts as not found there
                theirs = None
            sys.modules[top] = saved
            if not _same(theirs, getattr(module, "__spec__", None)):
                for n in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                    self._kept[n] = sys.modules.pop(n)
        sys.modules.update(self.hidden)
        return False

    def find_spec(self, name, path=None, target=None):
        if path is not None or _thread.get_ident() != self.thread or name in _Watch.watched:
            return None
        where = self.roots.get(name)
        if where is not None:
            spec = self.finder.find_spec(name, [where])
            if spec is None:
                raise ModuleNotFoundError(f"No module named {name!r} where torchgen-patch is installed ({where})",
                                          name=name)
            return spec
        if name in sys.stdlib_module_names:
            spec = _std_spec(name)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {name!r} in the standard library", name=name)
            return spec
        spec = self.finder.find_spec(name, [p for p in sys.path if p not in self.own])
        if spec is not None:
            return spec
        for finder in list(sys.meta_path):  # builtins, frozen modules, editable installs' finders
            find = getattr(finder, "find_spec", None)
            if finder is self or finder is _Watch or finder is self.finder or find is None:
                continue
            spec = find(name, None, target)
            if spec is not None:
                return spec
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _stdlib_dirs():
    """Where this interpreter's standard library lives: the entries of sys.path at start that are its library directory
    (or below it: lib-dynload, but no site-packages) or its zip beside it."""
    if not _std_dirs:
        lib = os.path.abspath(getattr(sys, "_stdlib_dir", None) or os.path.dirname(os.__file__))
        for p in _start_path or sys.path:
            a = os.path.abspath(p) if isinstance(p, str) and p else ""
            below = a[len(lib):].split(os.sep) if a.startswith(lib + os.sep) else None
            if a == lib or below and not {"site-packages", "dist-packages"} & set(below) or \
                    a.endswith(".zip") and os.path.dirname(a) == os.path.dirname(lib):
                _std_dirs.append(a)
        if lib not in _std_dirs:
            _std_dirs.extend((lib, os.path.join(lib, "lib-dynload")))
    return _std_dirs


def _std_spec(name):
    """The spec of the standard library's module ``name`` (built in, frozen, a file of its directories), or None."""
    for finder in _STD_FINDERS:
        spec = finder.find_spec(name)
        if spec is not None:
            return spec
    return _PathFinder.find_spec(name, _stdlib_dirs())


def _planted(module):
    """Whether ``module`` (of a standard library's name) is a file from outside the standard library."""
    spec = getattr(module, "__spec__", None)
    if getattr(spec, "loader", None) in _STD_FINDERS:
        return False
    f = getattr(module, "__file__", None)
    if not isinstance(f, str):
        return False  # made in memory by the program itself, not a file another account could plant
    f = os.path.abspath(f)
    return not any(f.startswith(os.path.join(d, "")) for d in _stdlib_dirs())


def std_module(name):
    """The standard library's module ``name`` for the hook's own use outside a block of the tool's."""
    module = sys.modules.get(name)
    if module is not None and not _planted(module):
        return module
    with _Own({}):
        __import__(name)
        return sys.modules[name]


def _part(name, undone):
    """The hook's part ``name`` (HERE/name.py), once per process, by its path: never found on sys.path nor put in
    sys.modules, read from one descriptor (a regular file of the hook file's owner, writable by no one the hook's
    own file keeps out), compiled from those bytes and run inside _Own (its imports: the standard library's,
    whatever the program's path holds). None where it cannot be had, said once (``undone``: what is left undone)."""
    if name not in _parts:
        path = os.path.join(HERE, name + ".py")
        try:  # a FIFO is opened without blocking, and never read
            with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK | os.O_NOCTTY)) as fh:
                st, hook = os.fstat(fh.fileno()), os.stat(os.path.join(HERE, NAME + ".py"))
                if st.st_mode & 0o170000 != 0o100000 or st.st_uid != hook.st_uid or st.st_mode & 0o022 & ~hook.st_mode:
                    raise OSError(0, f"not a regular file as the hook's own (uid {st.st_uid}, mode {st.st_mode:o})")
                source = fh.read()
            part = type(sys)(name)
            part.__file__ = path
            with _Own({}):
                exec(compile(source, path, "exec", dont_inherit=True), vars(part))
        except Exception as e:  # noqa: BLE001 — a part gone or damaged: said, and the program goes on
            part, why = None, e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
            _say(f"torchgen-patch: {undone}: its part {path} cannot be loaded: {why} (hint: reinstall torchgen-patch)")
        _parts.setdefault(name, part)  # two threads at once: the first one's
    return _parts[name]


def program_import(name):
    """Import ``name`` (a module of --import) as the program would: the tool's routing is off in this thread."""
    import importlib

    own = _Own.active
    if own is None:
        return importlib.import_module(name)
    thread, own.thread = own.thread, None
    try:
        return importlib.import_module(name)
    finally:
        own.thread = thread


def _under(module, root):
    f = getattr(module, "__file__", None) or ""
    return bool(f) and os.path.abspath(f).startswith(os.path.join(os.path.abspath(root), ""))


def _same(a, b):
    if a is None or b is None:
        return False
    return a.origin == b.origin and list(a.submodule_search_locations or []) == \
        list(b.submodule_search_locations or [])
