# torchgen-patch run: this directory is put first on PYTHONPATH of the program it runs, so
# every Python process of that program (torchrun's workers included) installs the kernels at
# start. What to install comes from $TORCHGEN_PATCH_RUN (torchgen_patch/runtime/launch.py).
import sys as _tgp_sys

try:
    try:
        from torchgen_patch.runtime.launch import startup as _tgp_startup
    except ImportError:  # torchgen-patch lives elsewhere than this program's path: at the end of it
        import json as _tgp_json
        import os as _tgp_os

        _tgp_sys.path.append(_tgp_json.loads(_tgp_os.environ["TORCHGEN_PATCH_RUN"])["package"])
        from torchgen_patch.runtime.launch import startup as _tgp_startup
except Exception as _tgp_error:  # noqa: BLE001 — never break the user's interpreter
    print(f"torchgen-patch: NOT active: {type(_tgp_error).__name__}: {_tgp_error}", file=_tgp_sys.stderr)
else:
    _tgp_startup(__file__)
