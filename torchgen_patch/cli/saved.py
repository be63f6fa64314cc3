"""The saved-tensor check `run` and `enable` give each process, from their flags (--check-saved,
--check-every, --findings)."""

from __future__ import annotations

import os

from ..errors import InputError


def saved_check_of(args) -> tuple[str | None, int, str | None]:
    """The saved-tensor check `run` and `enable` give each process: (its mode, None where off; each step
    checked with probability 1/every; the folder of --findings made absolute and checked now, before any
    process starts). No --check-saved: warn, sampled at DEFAULT_EVERY; --check-saved warn|raise: every step
    unless --check-every; --check-saved=off: none, and --check-every or --findings with it is refused."""
    from ..saved.sample import DEFAULT_EVERY

    asked, every = args.check_saved, args.check_every
    if asked == "off":
        given = [flag for flag, value in (("--check-every", every), ("--findings", args.findings)) if value]
        if given:
            raise InputError(None, None, f"{' and '.join(given)} need the saved-tensor check, which "
                                         "--check-saved=off turns off", "drop one or the other")
        return None, 1, None
    every = every if every is not None else 1 if asked else DEFAULT_EVERY
    folder = None
    if args.findings:
        from ..saved.fleet import open_folder

        folder = os.path.abspath(args.findings)
        open_folder(folder).close()
    return asked or "warn", every, folder
