"""The release check: PyTorch's own source tree, lint and tests, with and without this project.

The tree is Debian's source package `pytorch` (trixie: 2.6.0+dfsg), fetched with apt through a private
sources list into .cache/pytorch-src/ (testbed/debian_source.py), used only as its pins vouch for it
(testbed/release_inputs.py: a .dsc the project or the signed index pins, the tarball that .dsc pins, each
read from one checked descriptor), and unpacked fresh, under git, for each run. The torch of the same
release comes from the package index into a venv of its own (.venv-check-<release>, a CUDA build of
3-5 GB that runs on CPU) with PyTorch's test dependencies, lintrunner and this project. The check runs
the tree's own code (`lintrunner init` runs the init_commands of its .lintrunner.toml; then its codegen
and its tests): run it in a throwaway container or as an unprivileged account, never as an account
whose files matter. Steps:

  checkout    the checkout world on the real tree, in a venv without torch: the five counts (equal to the
              compatibility matrix's row of the release), `gen --strict`, `diff --mode fix` applied with git,
              the tree's own codegen before and after, lint after; real lintrunner with the tree's own
              .lintrunner.toml plus the VERSIONCOUNTER block for PyTorch's repository, before and after.
  adapters    PyTorch's own lint adapters (`lintrunner init`, then each linter alone) on the files the fix
              adds or edits; linters that need the network are listed as not run.
  regression  the fix's regression test, from the tree's test/: fails unpatched, passes under `torchgen-patch run`.
  <group>     PyTorch's own test files (TEST_GROUPS), unpatched and under `torchgen-patch run`, with per-test
              outcomes (junit xml) compared test by test; every difference needs a verdict in VERDICTS.

Modules, by job: config (the steps, the test groups, the paths), source (fetching, checking and unpacking
the tree), venv (the venv of the release's time), checkout and adapters (the checkout world and PyTorch's
lint adapters), runner, ranks and groups (PyTorch's test files, the ranks that hang, the groups compared
side by side), verdicts, report and store (what passes, the markdown, the json), and main, which strings
them together. `python scripts/pytorch_check.py` runs main.
"""
