"""Every rule of the lint, each in one place: its id, name, descriptions, and
the one function that makes its findings."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import Location
from ..vocabulary import StepOutcome
from . import Finding


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    short: str
    full: str  # what it finds and why it matters
    severity: str = "error"


MISSING = Rule(
    "missing-inplace-or-view-kernel", "MissingInplaceOrViewKernel", "Mutating op with no ADInplaceOrView kernel",
    "The op writes arguments and returns nothing, so PyTorch's autograd codegen emits no ADInplaceOrView kernel "
    "for it (or, for a custom op, none was registered); whether it bumps version counters depends on its backend "
    "kernel, and autograd can silently compute gradients from overwritten tensors.")
UNSUPPORTED = Rule(
    "unsupported-mutating-op", "UnsupportedMutatingOp", "Mutating op a generated kernel cannot serve",
    "The op writes arguments and returns nothing but is not in-place, out= or mutable by torchgen's rules (or "
    "writes a form no kernel handles); decide in the overlay.")
STALE_BASELINE = Rule(
    "stale-baseline-entry", "StaleBaselineEntry", "Baseline entry that no longer matches a finding",
    "The baseline accepts a finding that is gone; remove the entry so it cannot hide a new one.", "warning")
KERNEL_MISSING = Rule(
    "generated-kernel-missing", "GeneratedKernelMissing", "Op of the plan without a generated kernel",
    "The generated directory has no kernel for this op; run torchgen-patch gen.")
KERNEL_STALE = Rule(
    "generated-kernel-out-of-date", "GeneratedKernelOutOfDate", "Generated kernel differs from what gen makes now",
    "The kernel in the generated directory is out of date; run torchgen-patch gen.")

STALE_FILE = Rule(
    "stale-generated-file", "StaleGeneratedFile", "Kernel file the generated directory's manifest does not name",
    "A kernel shard left from an earlier gen with more shards: a build that globs the directory compiles old "
    "kernels; run torchgen-patch gen (it removes the files of its own earlier runs).")

FILE_MISSING = Rule(
    "generated-file-missing", "GeneratedFileMissing", "Output of gen missing from the generated directory",
    "A file gen writes is not in the directory: a build compiles an incomplete set of kernels, or registers "
    "nothing; run torchgen-patch gen.")
FILE_MODIFIED = Rule(
    "generated-file-modified", "GeneratedFileModified", "Generated file differs from what gen writes for this plan",
    "The file is not, byte for byte, the one gen renders from this yaml and overlay (a hash recorded beside it "
    "proves nothing: an edit can update it): it was edited, truncated or left by another run; run torchgen-patch "
    "gen.")
REGISTRATION = Rule(
    "generated-registration-mismatch", "GeneratedRegistrationMismatch",
    "Register file does not register exactly the plan's kernels",
    "RegisterADInplaceOrViewPatch.cpp decides which kernels a build registers; one that names other kernels "
    "than the plan leaves ops unpatched or registers kernels nobody planned; run torchgen-patch gen.")

OUT_REQUIRES_GRAD = Rule(
    "out-requires-grad-unchecked", "OutRequiresGradUnchecked", "out= op that never refuses inputs requiring grad",
    "The op is out= and returns nothing, so PyTorch's autograd codegen (gen_variable_type) gives it no "
    "derivative and its VariableType kernel only redispatches: it never raises \"functions with out=... "
    "arguments don't support automatic differentiation\" as add(out=) does. With grad mode on, an input that "
    "requires grad is accepted and the outputs do not require grad: gradients through them are dropped "
    "without a word.")
INPLACE_UNCHECKED = Rule(
    "inplace-check-missing", "InplaceCheckMissing", "Void in-place op whose autograd kernel skips check_inplace",
    "The op writes its arguments in place and returns nothing, and its VariableType kernel calls no "
    "check_inplace: in grad mode a leaf that requires grad is modified without the error other in-place ops "
    "raise (\"a leaf Variable that requires grad is being used in an in-place operation\").", "warning")

OPTIMIZER_UNSEEN = Rule(
    "optimizer-step-unseen", "OptimizerStepUnseen", "Optimizer whose step writes parameters without a version bump",
    "A probe step of the class on a tiny parameter changed the parameter and moved no version counter: it writes "
    "outside the dispatcher (C++ bound with pybind, data_ptr, numpy), through an alias whose counter is its own "
    "(p.data), or through an operator without an ADInplaceOrView kernel. A parameter saved for backward and then "
    "stepped is used stale, without autograd's \"modified by an inplace operation\" error. An optimizer entry in "
    "the overlay (for an operator: install(runtime_ops=...)) makes install() and run bump what it writes.")
OPTIMIZER_NOT_PROBED = Rule(
    "optimizer-not-probed", "OptimizerNotProbed", "Optimizer class whose probe step could not tell",
    "The class could not be constructed or stepped on a tiny parameter, with its defaults (and common values, such "
    "as lr=0.001, for the hyperparameters it has no default for) nor with momentum or betas switched on where their "
    "default is off, or its probe steps changed nothing: whether autograd sees what its step writes is unknown.",
    "warning")
OPTIMIZER_ENTRY_UNKNOWN = Rule(
    "optimizer-entry-unknown", "OptimizerEntryUnknown", "Optimizer entry that names no optimizer class",
    "The overlay's optimizer entry names a class its module (imported by the lint) does not define as a subclass of "
    "torch.optim.Optimizer: a misspelt or moved class. An entry applies to the class it names exactly, so this one "
    "never applies, and the optimizer it meant steps unbumped. An entry of a module not imported is not checked "
    "(the library may be absent here).")

# One rule, one entry: a new rule is a Rule above, its entry here and the function that makes its findings.
RULES = {r.id: r for r in (MISSING, UNSUPPORTED, STALE_BASELINE, KERNEL_MISSING, KERNEL_STALE, STALE_FILE,
                           FILE_MISSING, FILE_MODIFIED, REGISTRATION, OUT_REQUIRES_GRAD, INPLACE_UNCHECKED,
                           OPTIMIZER_UNSEEN, OPTIMIZER_NOT_PROBED, OPTIMIZER_ENTRY_UNKNOWN)}


def _make(rule: Rule, loc: Location, op: str, message: str) -> Finding:
    return Finding(loc, op, rule.id, message, rule.severity)


def missing(record) -> Finding:
    """A missing op of a yaml scan (scan.model.OpRecord with verdict missing)."""
    return _make(MISSING, record.loc, record.name, f"{record.name}: {record.reason}")


def unsupported(record) -> Finding:
    return _make(UNSUPPORTED, record.loc, record.name, f"{record.name}: {record.reason}")


def out_requires_grad(record) -> Finding:
    return _make(OUT_REQUIRES_GRAD, record.loc, record.name,
                 f"{record.name}: out= op that returns nothing: its autograd kernel never refuses an input or "
                 "output that requires grad, so gradients through its outputs are silently lost")


def inplace_unchecked(record) -> Finding:
    return _make(INPLACE_UNCHECKED, record.loc, record.name,
                 f"{record.name}: in-place op that returns nothing: its autograd kernel never calls check_inplace, "
                 "so a leaf that requires grad is written without an error")


def missing_at_runtime(op) -> Finding:
    """A mutating op of the live registry (runtime.registry.RuntimeOp) with no kernel."""
    return _make(MISSING, op.loc, op.name, f"{op.name}: writes {', '.join(op.written)} and has no ADInplaceOrView "
                                           "kernel: nothing bumps the version counters of what it writes")


def optimizer_probe(probe) -> Finding:
    """An optimizer class whose probe step (runtime.optim_probe.StepProbe) wrote unseen, or could not tell."""
    given = f" (probed with {', '.join(probe.given)})" if probe.given else ""
    if probe.outcome != StepOutcome.UNSEEN:
        return _make(OPTIMIZER_NOT_PROBED, probe.loc, probe.cls, f"{probe.cls}: not probed{given}: {probe.detail}")
    fix = (f"install(runtime_ops=[{', '.join(repr(o) for o in probe.through)}]) or run --runtime-op serves "
           + ("it" if len(probe.through) == 1 else "them")) if probe.through else \
        f"an optimizer entry in the overlay (optimizers: {probe.cls}: writes: [params]) makes install() and run bump it"
    return _make(OPTIMIZER_UNSEEN, probe.loc, probe.cls,
                 f"{probe.cls}: its step{given} changed the parameter without moving its version counter, so autograd "
                 f"cannot see the write: {probe.detail}; {fix}")


def optimizer_entry_unknown(loc: Location, path: str, what: str) -> Finding:
    """An overlay optimizer entry ``path`` whose imported module defines ``what`` under its name."""
    return _make(OPTIMIZER_ENTRY_UNKNOWN, loc, path,
                 f"{path}: the optimizer entry names {what}, so it never applies; "
                 "name the class as its module defines it")


def stale_baseline(path: str, line: int, op: str, rule: str) -> Finding:
    return _make(STALE_BASELINE, Location(path, line), op,
                 f"{op}: the baseline accepts a '{rule}' finding that is gone; remove the entry")


def kernel_missing(loc: Location, op: str, directory: str) -> Finding:
    return _make(KERNEL_MISSING, loc, op, f"{op}: no kernel in {directory}; run torchgen-patch gen")


def kernel_stale(loc: Location, op: str, directory: str) -> Finding:
    return _make(KERNEL_STALE, loc, op, f"{op}: the kernel in {directory} is out of date; run torchgen-patch gen")


def stale_file(path: str, manifest: str, shards: int) -> Finding:
    name = os.path.basename(path)
    return _make(STALE_FILE, Location(path, 1), name,
                 f"{name}: not one of the {shards} shard(s) {manifest} names; a left-over of an earlier gen")


def file_missing(path: str) -> Finding:
    name = os.path.basename(path)
    return _make(FILE_MISSING, Location(path, None), name, f"{name}: missing; run torchgen-patch gen")


def file_modified(path: str, what: str) -> Finding:
    name = os.path.basename(path)
    return _make(FILE_MODIFIED, Location(path, 1), name, f"{name}: {what}; run torchgen-patch gen")


def registration_mismatch(path: str, unregistered: list[str], unplanned: list[str]) -> Finding:
    def few(ops):
        return ", ".join(ops[:3]) + (f" and {len(ops) - 3} more" if len(ops) > 3 else "")

    parts = ([f"registers none of {few(unregistered)}"] if unregistered else []) + \
        ([f"registers {few(unplanned)}, which the plan has no kernel for"] if unplanned else [])
    return _make(REGISTRATION, Location(path, 1), os.path.basename(path),
                 f"{os.path.basename(path)}: {'; '.join(parts)}; run torchgen-patch gen")
