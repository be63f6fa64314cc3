"""The commands of an enabled environment: `enable`, `disable` and `status` (runtime/launch/enable.py does the
work; these say it)."""

from __future__ import annotations

import sys

from ..saved.sample import words as check_words
from .commands import build_log_for, named_checked, needs_torch, say
from .saved import saved_check_of
from .parser import options


def enable(args) -> int:
    from ..runtime.launch import enable as en

    site = en.site_dir()
    en.check_writable(site)  # before any work: a read-only environment costs nothing
    needs_torch("enable")  # the library is built now, against this environment's torch
    opts = options(args)
    named_checked(args, opts)
    check_saved, every, folder = saved_check_of(args)
    spec, what = en.prepared(opts, args.backend, args.op, quiet=args.quiet, verbose=args.verbose,
                             log=build_log_for(args), strict=args.strict, check_saved=check_saved, findings=folder,
                             check_every=every)
    st = en.enable(spec, site)
    undo = "`torchgen-patch disable` or `pip uninstall torchgen-patch` undoes it" if st.recorded else \
        ("`torchgen-patch disable` undoes it (this torchgen-patch is installed elsewhere: `pip uninstall` leaves the "
         "file, which then does nothing)")
    print(f"enabled: {st.path}: every Python process of this environment that imports torch gets the kernels "
          f"({args.backend}: {what}); {undo}")
    return 0


def disable(args) -> int:
    from ..runtime.launch import enable as en

    site = en.site_dir()
    before = en.state(site)
    if not before.present and not before.data_present:
        say(args, f"disable: not enabled ({before.path} does not exist)")
        return 0
    en.check_writable(site, removing=True)
    en.disable(site)
    removed = " and ".join(p for p, there in ((before.path, before.present), (before.data, before.data_present))
                           if there)
    print(f"disabled: removed {removed}" + (", and their lines in pip's RECORD" if before.recorded else ""))
    if args.verbose:
        print(f"disable: it was {_enabled_line(before)}", file=sys.stderr)
    return 0


def status(args) -> int:
    """Exit 0 when enabled as this torchgen-patch writes it, with nothing to fix; 1 otherwise (a line for
    each thing to fix: the build it names refused, a site-packages directory others may write); -q: the
    exit code alone."""
    from ..runtime.launch import enable as en
    from ..runtime.launch.status import named_build

    st = en.state()
    build = named_build(st.spec.library) if st.spec is not None and st.spec.library else None
    fix = []  # what to fix, beside a file that is not as written
    e = build.error if build is not None and build.verdict == "refused" else None
    if e is not None:
        fix.append(f"refused: {e.message}: every process of this environment that imports torch refuses it too "
                   f"({_fails(st.spec)})" + (f" (hint: {e.hint})" if e.hint else ""))
    if st.unsafe_site is not None:
        fix.append(f"{st.unsafe_site[0]} (hint: {st.unsafe_site[1]})")
    if not st.present:
        line = (f"not enabled: {st.path} does not exist (`torchgen-patch enable` patches every Python process of "
                "this environment that imports torch" + (f"; {st.data} is left over: `torchgen-patch disable` removes "
                                                         "it)" if st.data_present else ")"))
    elif st.problem:
        line = f"{st.path}: {st.problem} (`torchgen-patch enable` writes it again, `torchgen-patch disable` removes it)"
    else:
        line = f"enabled: {_enabled_line(st, build)}"
    if not args.quiet:
        print("\n".join([line, *fix]))
        if args.verbose and st.spec is not None:
            print(f"status: its launch spec: {st.spec.to_json()}", file=sys.stderr)
    return 0 if st.present and not st.problem and not fix else 1


def _enabled_line(st, build=None) -> str:
    """What an enabled environment's file does, for people (``build``: the verdict on the build it names)."""
    spec = st.spec
    if st.problem or spec is None:
        return f"{st.path}: {st.problem or 'not enabled'}"
    ops = "every op of the plan" if spec.ops is None else ", ".join(spec.ops)
    pip = {True: "pip uninstall torchgen-patch removes it", False: "pip's RECORD of torchgen-patch does not list it",
           None: "torchgen-patch is installed elsewhere: pip uninstall leaves it, and it then does nothing"}
    return (f"{st.path} (torchgen-patch {st.version}; {spec.backend.value}, {ops}{_build(build)}; "
            f"{'quiet' if spec.quiet else 'one line per process'}; {_fails(spec)}; "
            f"saved-tensor check: {check_words(spec.check_saved, spec.check_every)}"
            f"{f', findings to {spec.findings}' if spec.findings else ''}; {pip[st.recorded]})")


def _build(build) -> str:
    """The enabled line's words on the build its spec names (None: it names none)."""
    if build is None:
        return ""
    if build.verdict == "there":
        return "; the build it names is there"
    if build.verdict == "refused":
        return "; the build it names is refused (below)"
    if build.verdict == "unchecked":
        return f"; the build it names is not checked: {build.error.message}"
    gone = "is gone" if build.verdict == "gone" else f"cannot be used ({build.error.message})"
    return f"; the build it names {gone} (the first process that imports torch finds or builds one)"


def _fails(spec) -> str:
    return "strict: a process that cannot have the kernels stops (exit 3)" if spec.strict else \
        "fail open: a process that cannot have the kernels runs unpatched, said in one line"


ENVIRONMENT_COMMANDS = {"enable": enable, "disable": disable, "status": status}
