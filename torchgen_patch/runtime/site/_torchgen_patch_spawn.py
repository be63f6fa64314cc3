"""torchgen-patch's hook, its part for the processes a process of ``run`` starts: a Python child whose
command line or environment drops the hook is named in one line, since nothing of this tool will run in
it. The hook (``_torchgen_patch_hook.py`` beside this file) loads it by its path at the first process
the program starts, never at interpreter start; ``run`` imports it as a module of the package to refuse
such a command line before the program starts. Standard library only, and of it nothing but what the
interpreter has loaded already: a module it needs besides (shlex) comes through ``std``, the hook's
``std_module`` (never a module of that name elsewhere on the program's path). This file imports nothing of
the hook: what it needs of the hook's state comes with each call.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))  # the hook's folder: run's PYTHONPATH entry
ENV = "TORCHGEN_PATCH_RUN"  # the hook's ENV, the launch spec's variable
BLOCKING = {"I": "isolated mode ignores PYTHONPATH", "E": "it ignores PYTHONPATH",
            "S": "it skips the site module, which loads the hook"}


def on_spawn(event, args, *, enabled, stdlib, std, ours, hint):
    """The line that names the process an audit ``event`` (``args``: its arguments) starts, or None: it
    keeps the hook, it is not seen to be Python, or torch's compile machinery starts it. ``enabled``:
    the hook of an enabled environment runs here; ``stdlib``: the standard library's directories; ``std``:
    how a module of it is imported (``dropped``'s); ``ours``: the hook's globals (its frames and this
    file's are passed over); ``hint``: the line's."""
    if event == "subprocess.Popen":
        executable, argv, _cwd, env = args
    elif event == "os.system":
        executable, argv, env = None, ["/bin/sh", "-c", os.fsdecode(args[0])], None
    else:  # os.exec, os.posix_spawn: (path, argv, env)
        executable, argv, env = args
    argv = [os.fsdecode(a) for a in argv] if not isinstance(argv, (str, bytes)) else [os.fsdecode(argv)]
    why = dropped(argv, env, executable, enabled=enabled, std=std)
    if why is None or _from_compiler(stdlib, ours):
        return None
    command = _shown(argv)
    where = f"in pid {os.getpid()} after its exec" if event == "os.exec" else f"in a child of pid {os.getpid()}"
    return f"torchgen-patch: NOT active {where} ({command}): {why} (hint: {hint})"


# torch's compile machinery: the Python processes it starts (inductor's probe of the CPU's vector units, its
# compile workers, Triton's) compile code and never run autograd, so they need no kernels and are not named
COMPILERS = ("torch._inductor", "torch._dynamo", "torch.utils.cpp_extension", "triton")


def _from_compiler(stdlib, ours):
    """Whether torch's compile machinery starts the process: the frame nearest the start past the hook's
    (``ours``: its globals), this file's and the standard library's (``stdlib``: its directories) is one
    of COMPILERS' (only the nearest: a program's function compiled by torch.compile runs under
    torch._dynamo's frames, and what it starts is the program's)."""
    std = tuple(d + os.sep for d in stdlib)
    f = sys._getframe(1)
    while f is not None and (f.f_globals is globals() or f.f_globals is ours or f.f_code.co_filename.startswith(std)):
        f = f.f_back  # type: ignore[assignment]  # None ends the walk
    name = f.f_globals.get("__name__") if f is not None else None
    return isinstance(name, str) and any(name == m or name.startswith(m + ".") for m in COMPILERS)


def _shown(argv):
    text = " ".join(argv)
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return text if len(text) <= 80 else text[:77] + "..."


def dropped(argv, env=None, executable=None, enabled=False, check_env=True, std=None):
    """Why a process started as ``argv`` (``executable``: the file run, when it is not argv[0]) with
    the environment ``env`` (None: this process's) would run without the hook, or None: it keeps
    it, or it is not seen to be Python (a program whose interpreter cannot be read from its command
    line or its first line; what it starts in turn is its own business). ``enabled``: this
    environment's own Python patches itself (``torchgen-patch enable``), whatever the environment.
    ``std``: how a module of the standard library is imported when one is needed (the hook's ``std_module``;
    None: as an import statement does)."""
    env = dict(os.environ if env is None else env)
    env = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    argv = [os.fsdecode(a) for a in argv]
    prog = os.fsdecode(executable) if executable is not None else (argv[0] if argv else "")
    for _ in range(6):  # env, a shell's -c, a script's first line: a few levels, never a loop
        name = os.path.basename(prog)
        if name == "env":
            argv, env = _env_command(argv[1:], env)
            if not argv:
                return None
            prog = argv[0]
        elif name in ("sh", "bash", "dash", "zsh", "ksh") and len(argv) >= 3 and argv[1] == "-c":
            simple = _simple_command(argv[2], env, std or __import__)
            if simple is None:
                return None
            argv, env = simple
            prog = argv[0]
        elif _is_python(name):
            break
        else:
            script = _which(prog, env)
            line = _shebang(script)
            if line is None:
                return None
            parts = line.split(None, 1)
            argv = parts + [script] + argv[1:]
            prog = parts[0]
    else:
        return None
    flags = interpreter_flags(argv)
    for flag, why in BLOCKING.items():
        if flag in flags:
            return f"{name} -{flag}: {why}"
    if enabled and os.path.dirname(os.path.abspath(_which(prog, env) or prog)) == \
            os.path.dirname(os.path.abspath(sys.executable)):
        return None  # this environment's own Python: the enabled environment patches it
    if check_env:
        hooked, told = HERE in env.get("PYTHONPATH", "").split(os.pathsep), bool(env.get(ENV))
        if not hooked and not told:
            return f"its environment has neither torchgen-patch's PYTHONPATH entry nor ${ENV}"
        if not hooked:
            return "its own PYTHONPATH leaves out torchgen-patch's hook"
        if not told:
            return f"its environment has no ${ENV}"
    return None


def _is_python(name):
    """python, python3, python3.12, python3.13t (a free-threaded build)."""
    if not name.startswith("python"):
        return False
    version = name[len("python"):]
    if version.endswith("t"):
        version = version[:-1]
    major, dot, minor = version.partition(".")
    return version == "" or major.isdigit() and (minor.isdigit() or not dot)


def interpreter_flags(argv):
    """The single-letter options of a ``python`` command line, up to its script, -c or -m."""
    flags: set[str] = set()
    args = iter(argv[1:])
    for a in args:
        if a in ("-", "--") or not a.startswith("-"):
            break
        if a.startswith("--"):
            if a == "--check-hash-based-pycs":
                next(args, None)
            continue
        for i, c in enumerate(a[1:]):
            if c in "cm":  # the program follows
                return flags
            if c in "WX":  # takes a value: the rest of this word, or the next one
                if i == len(a) - 2:
                    next(args, None)
                break
            flags.add(c)
    return flags


def _env_command(args, env):
    """``env [OPTION]... [NAME=VALUE]... COMMAND [ARG]...``: (the command line, its environment)."""
    env, args, i = dict(env), list(args), 0
    while i < len(args):
        a = args[i]
        if a in ("-i", "-", "--ignore-environment"):
            env = {}
        elif a in ("-u", "--unset") and i + 1 < len(args):
            env.pop(args[i + 1], None)
            i += 1
        elif a.startswith("--unset=") or (a.startswith("-u") and not a.startswith("--")):
            env.pop(a.split("=", 1)[1] if a.startswith("--") else a[2:], None)
        elif a in ("-S", "--split-string") and i + 1 < len(args):
            args[i:i + 2] = args[i + 1].split()
            continue
        elif a.startswith(("-S", "--split-string=")):
            args[i:i + 1] = (a.split("=", 1)[1] if a.startswith("--") else a[2:]).split()
            continue
        elif a in ("-C", "--chdir"):
            i += 1
        elif a == "--":
            i += 1
            break
        elif a.startswith("-"):
            pass  # -0, -v, --debug, ...: no bearing on what runs
        elif "=" in a:
            k, v = a.split("=", 1)
            env[k] = v
        else:
            break
        i += 1
    return args[i:], env


def _simple_command(text, env, std):
    """A shell's ``-c`` text that is one simple command (assignments, a program, its arguments, quoted
    or not), as (argv, env); None for anything a shell would expand, redirect or chain. ``std``: how the
    standard library's shlex is imported."""
    if any(c in text for c in "|&;<>()$`\\\n*?[{~"):
        return None
    try:
        words = std("shlex").split(text)
    except ValueError:
        return None
    env = dict(env)
    while words and "=" in words[0] and not words[0].startswith("="):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return (words, env) if words else None


def _which(prog, env):
    """The file ``prog`` names as ``execvp`` finds it: a name with a slash as it is, any other the first
    executable regular file of that name on PATH; None when there is none (the exec fails: nothing runs,
    and a file of that name in the working directory is not it)."""
    if os.sep in prog:
        return prog
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", prog)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _shebang(path):
    """The interpreter line of a script (``#!`` and what follows, up to the line's end), or None. Only a
    regular file is read (a symlink to one is followed), and nothing here can block: a FIFO or a device
    (another account's, planted under the program's name) is opened with O_NONBLOCK, if at all, and not read."""
    import stat

    if path is None:
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, 256)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    return os.fsdecode(line) if line else None
