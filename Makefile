# torchgen-patch: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_STAMP := $(VENV)/.torchgen-patch-run
STAMP  := $(VENV)/.torchgen-patch-installed
OUT    ?= build/generated
# setuptools warns at every editable install that a folder named like the package may shadow it; this
# checkout is that folder on purpose, so that one third-party warning is filtered by its text
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: setup run test check test-fast durations hooks bench goldens patches clean test-torch2.14 audit matrix test-torch pytorch-check docs source-build

# Two steps: what the main job needs (requirements-run.txt), then the test and lint tools on top.
setup: $(STAMP)

$(RUN_STAMP): pyproject.toml requirements-run.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-run.txt
	$(EDITABLE) $(BIN)/python -m pip install -q --no-deps -e .
	touch $@

$(STAMP): $(RUN_STAMP) requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

# The main job on the embedded default (the installed torch's own native_functions.yaml):
# find the ops, generate their kernels, build them and check every op before/after.
# Each step prints one summary line on stdout (progress and notes go to stderr, so
# `make run > log` keeps the summary); the full reports land in build/.
run: $(RUN_STAMP)
	@mkdir -p build
	@$(BIN)/torchgen-patch lint --requires-grad --against-runtime -o build/lint.txt || [ $$? -eq 1 ]
	@$(BIN)/torchgen-patch gen --strict -o $(OUT) --output-dependencies $(OUT).cmake
	@# the report shows every op before and after; verify exits by the run with the patch (the run
	@# without it is the "before" column), so the job fails only when a row with the patch fails
	@$(BIN)/torchgen-patch verify --both --format markdown -o build/verify-cpu.md
	@echo "lint counts the ops with no version-counter kernel and the out= ops that never refuse inputs requiring"
	@echo "grad; verify counts the ops whose tensors really kept their version on this machine before the patch (the"
	@echo "others bump by luck of their backend kernel) and after it: build/verify-cpu.md"
	@echo "Next, by what you do (README.md):"
	@echo "  train with torch:       pip install . in your environment, then: torchgen-patch run -- python train.py"
	@echo "  maintain PyTorch/fork:  torchgen-patch lint --pytorch-root ~/pytorch --requires-grad   (docs/checkout-and-ci.md)"
	@echo "  write an extension:     torchgen-patch lint --runtime --import YOURLIB --namespace YOURLIB   (docs/guide.md)"

# The checkout's own builds: `make run` and the tests (tests/conftest.py) share one kernel cache, the
# checkout's, so the tests reuse what `make run` compiled; every warning is an error in both (a user's
# install never adds -Werror).
run: export TORCHGEN_PATCH_CACHE := $(CURDIR)/.cache/torchgen-patch
run: export TORCHGEN_PATCH_EXTRA_CFLAGS := -Werror

# docs/cli.md, generated from the parser (tests/test_docs.py checks it is current).
docs: setup
	$(BIN)/python scripts/cli_reference.py

# The whole suite, as CI runs it (.ci/run): its 25 slowest items in the log, every item's time in
# build/pytest-junit.xml (`make durations` turns it into tests/durations.json).
test: setup
	@mkdir -p build
	$(BIN)/python -m pytest -q -ra --durations=25 --junitxml=build/pytest-junit.xml

# The short tier: every item but those that compile, make a virtual environment or took over 1 s in
# tests/durations.json (the self-check kept), and one case in N of a few large families of like cases
# (marks set by tests/tiers.py); `make test` runs them all.
check: setup
	$(BIN)/python -m pytest -q -ra -m "not build and not venv and not sampled and (not long or core)" --durations=10

test-fast: check

# tests/durations.json from the last `make test` (the `slow` mark of `make check` is read from it), and
# reports/test-durations-cpu-torch<release>.md: the seconds of each test file and the 25 slowest items.
durations:
	$(BIN)/python scripts/test_durations.py build/pytest-junit.xml --note "$(NOTE)"
	$(BIN)/python scripts/durations_report.py build/pytest-junit.xml

# git's commit-msg hook that refuses a subject of 72 characters or more (scripts/commit-msg), linked into this
# clone's hooks directory (core.hooksPath, or .git/hooks; a worktree's too).
hooks:
	@d=$$(git rev-parse --git-path hooks) && mkdir -p "$$d" && ln -sf "$(CURDIR)/scripts/commit-msg" "$$d/commit-msg" \
		&& echo "installed $$d/commit-msg"

# Every benchmark; the per-call instruction counts (callgrind) need valgrind on PATH (else "not run").
bench: setup
	$(BIN)/python bench/run.py $(BENCH_ARGS)

goldens: setup
	$(BIN)/python -m tests.regen_goldens

clean:
	rm -rf build .cache .pytest_cache

# The example diffs for the installed torch's codegen, the PR description measured on it (with the
# instruction counts `make bench` committed) and the fused-optimizer issue (tests check they are current).
patches: setup
	rm -rf build/tree && mkdir -p build
	$(BIN)/python -c "from testbed.upstream_tree import make_tree; make_tree('build/tree')"
	$(BIN)/torchgen-patch diff --pytorch-root build/tree --mode fix -o patches/gen_inplace_or_view_type-fix-torch2.13.diff \
		--pr-body patches/pr-body-torch2.13.md --instructions reports/bench-callgrind-cpu-torch2.13.0.json \
		--issue reports/upstream-issue-cpu-torch2.13.0.md
	$(BIN)/torchgen-patch diff --pytorch-root build/tree --mode error -o patches/gen_inplace_or_view_type-error-torch2.13.diff

# The suite on the newest torch release (2.14.1) in a venv of its own, with a
# kernel cache of its own so it never reuses builds made against torch 2.13.
.venv-2.14/.torchgen-patch-installed: pyproject.toml requirements-torch2.14.txt
	$(PYTHON) -m venv .venv-2.14
	.venv-2.14/bin/python -m pip install -q --upgrade pip
	.venv-2.14/bin/python -m pip install -q -r requirements-torch2.14.txt
	$(EDITABLE) .venv-2.14/bin/python -m pip install -q --no-deps -e .
	touch $@

test-torch2.14: .venv-2.14/.torchgen-patch-installed
	mkdir -p build
	TORCHGEN_PATCH_CACHE=$(CURDIR)/.cache/torchgen-patch-2.14 .venv-2.14/bin/python -m pytest -q -ra -p no:cacheprovider \
		> build/pytest-torch2.14.1.txt 2>&1; rc=$$?; cat build/pytest-torch2.14.1.txt; exit $$rc

# The extension-library audit (reports/ecosystem-audit-torch2.13.md): bitsandbytes and
# fbgemm come with the dev setup; torchao, torch-optimi and liger-kernel are put, without
# their dependencies, in a directory of their own. Writes build/; REPORT=1 updates reports/.
AUDIT_SITE := .cache/audit-site
audit: setup
	$(BIN)/python -m pip install -q --no-deps --target $(AUDIT_SITE) torchao==0.18.0 torch-optimi==0.3.3 liger-kernel==0.8.5
	mkdir -p build
	$(BIN)/python scripts/ecosystem_audit.py --site $(AUDIT_SITE) > build/ecosystem-audit.md
	@if [ "$(REPORT)" = 1 ]; then cp build/ecosystem-audit.md reports/ecosystem-audit-torch2.13.md; echo "updated reports/ecosystem-audit-torch2.13.md"; else echo "wrote build/ecosystem-audit.md"; fi


# The compatibility matrix (reports/compat-matrix.md): every torch release from 2.4 to the newest
# the index serves, checked from its wheel (downloaded one at a time, never installed, deleted
# after). Writes build/; REPORT=1 writes reports/ and the table of docs/compatibility.md.
matrix: setup
	$(BIN)/python scripts/compat_matrix.py $(if $(filter 1,$(REPORT)),--report) $(MATRIX_ARGS)

# The suite on any release, on CPU: `make test-torch TORCH=2.6.0` (a venv of its own, .venv-2.6.0,
# 3-5 GB with the CUDA libraries; remove it after), with a kernel cache of its own. Writes
# build/pytest-torch$(TORCH).txt; committed as reports/pytest-torch$(TORCH).txt it fills the
# matrix's runtime columns.
TV := .venv-$(TORCH)
test-torch:
	@test -n "$(TORCH)" || { echo "error: give TORCH=X.Y.Z" >&2; exit 2; }
	test -x $(TV)/bin/python || $(PYTHON) -m venv $(TV)
	grep -v '^torch==' requirements-torch2.14.txt > $(TV)/requirements.txt
	$(TV)/bin/python -m pip install -q --no-cache-dir torch==$(TORCH) -r $(TV)/requirements.txt
	$(EDITABLE) $(TV)/bin/python -m pip install -q --no-deps -e .
	mkdir -p build
	{ echo "# make test-torch TORCH=$(TORCH) (torch $$($(TV)/bin/python -c 'import torch; print(torch.__version__)'), run on CPU at commit $$(git describe --always --dirty); no GPU on this machine)"; \
	  TORCHGEN_PATCH_CACHE=$(CURDIR)/.cache/torchgen-patch-$(TORCH) $(TV)/bin/python -m pytest -q -ra -p no:cacheprovider; } \
		> build/pytest-torch$(TORCH).txt 2>&1; rc=$$?; tail -30 build/pytest-torch$(TORCH).txt; exit $$rc


# The release check (docs/release-check.md): PyTorch's own source tree (Debian's source package), its
# lint adapters and its own test files, unpatched and under `torchgen-patch run`, on CPU in a venv of the
# matching torch release (.venv-check-<release>, 3-5 GB). Writes build/; REPORT=1 writes reports/ and
# the docs' table; CHECK_ARGS='--only test_torch.py' re-runs one step or test group.
pytorch-check: setup
	$(BIN)/python scripts/pytorch_check.py $(if $(filter 1,$(REPORT)),--report) $(CHECK_ARGS)


# A torch built from source as a checked world (reports/source-build-torch2.6.0-debian.md): Debian's own
# build of torch in a Debian trixie root made with debootstrap, the tool installed there, and lint, build,
# verify --both, verify --check requires-grad and run inside it. As root; the root (about 2 GB, a few
# minutes to make) stays in .cache/source-build/ for the next run. Writes build/; REPORT=1 writes
# reports/ and the compatibility matrix's row.
source-build: setup
	REPORT=$(REPORT) scripts/check_source_build.sh
