"""The saved-tensor check in real training, on CPU: no false findings and results unchanged (small
GPT-2, BERT and Llama configurations of transformers, a ResNet-18, fused and foreach AdamW, AMP,
clipping, gradient checkpointing, torch.compile, Trainer, ``accelerate launch``), every loss
bit-identical with the check on and off, the kernels installed (on every step, and as ``torchgen-patch
run`` gives it with no flag: sampled, seeded so that steps are drawn); and DeepSpeed's CPU optimizers,
which write outside the dispatcher, are silent stepped between forward and backward without the
check and a finding naming the optimizer with it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.build


def _env(**extra):
    from tests.support import root_env

    return root_env(**extra)


def _json_of(proc) -> dict:
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_training_small_models_gives_no_finding_and_the_same_losses(library, tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from saved_training import CASES

    cases = ",".join(sorted(CASES))
    env = _env(TORCHGEN_PATCH_LIBRARY=library.path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    script = os.path.join(ROOT, "tests", "saved_training.py")
    off, on = [_json_of(subprocess.Popen([sys.executable, script, mode, cases], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=env)) for mode in ("off", "raise")]
    assert sorted(off) == sorted(on) == sorted(CASES)
    for case in CASES:
        assert on[case]["losses"] == off[case]["losses"], case  # bit for bit
        assert on[case]["findings"] == 0 and on[case]["checked"] > 0, case
        assert min(off[case]["losses"][1:]) < off[case]["losses"][0], case  # it trains (a step may overshoot)
    # batch norm writes its running statistics after saving them: its own write, said so, no finding
    assert set(on["resnet18-foreach"]["skipped"]) == {"written by the op that saved it (batch norm's running "
                                                      "statistics)"}
    _under_the_default_check(env, script, off)


# run's default check (warn, 1 step in 32) draws 1 step in 32: seeded so that of the first draws, the 1st, 2nd
# and 4th hit (steps 2 and 3 of the first case, 2 of the second: Draw's generator seeded with this string)
DEFAULT_SEED = "5052"
DEFAULT_CASES = ("gpt2-fused-clip", "llama-foreach-checkpointing-clip")  # checkpointing's hooks compose with it


def _under_the_default_check(env: dict, script: str, off: dict) -> None:
    """Two of the cases under ``torchgen-patch run`` with no flag, the check the product gives a program
    (sampled, warn): steps drawn and checked, no finding, the same losses bit for bit as without the check."""
    from torchgen_patch.saved import DEFAULT_EVERY

    proc = subprocess.Popen([sys.executable, "-m", "torchgen_patch", "run", "--", sys.executable, script, "default",
                             ",".join(DEFAULT_CASES)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env, TORCHGEN_PATCH_CHECK_SEED=DEFAULT_SEED))
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-3000:]
    sampled = json.loads(out.strip().splitlines()[-1])
    assert f"saved-tensor check on (warn, 1 step in {DEFAULT_EVERY})" in err, err[-3000:]
    for case in DEFAULT_CASES:
        assert sampled[case]["losses"] == off[case]["losses"], case  # bit for bit
        assert sampled[case]["findings"] == 0 and sampled[case]["mode"] == "warn", case
        assert sampled[case]["draws"][2] == DEFAULT_EVERY, sampled[case]
    drawn, draws, _ = sampled[DEFAULT_CASES[-1]]["draws"]
    assert 1 <= drawn < draws and sum(sampled[c]["checked"] for c in DEFAULT_CASES) > 0, sampled  # steps checked
    count = rf": 0 changed saved tensors \(0 distinct\) in [1-9]\d* checked \(sampled at 1/{DEFAULT_EVERY}: [1-9]"
    assert re.search(count, err), err[-3000:]  # the count at exit: steps checked, nothing found


TRAINER = textwrap.dedent("""
    import json, sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=64,
                                       bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, 64, (8, 16))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(output_dir=sys.argv[1], max_steps=3, per_device_train_batch_size=2, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, optim="adamw_torch_fused",
                             max_grad_norm=1.0, seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    print(json.dumps([h["loss"] for h in trainer.state.log_history if "loss" in h]))
""")

ACCELERATE = textwrap.dedent("""
    import json, torch
    from accelerate import Accelerator
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model, opt = acc.prepare(model, opt)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    print(json.dumps(losses))
""")


def _under_run(check: str | None, program: list[str], tmp_path) -> tuple[list[float], str]:
    flags = [f"--check-saved={check}"] if check else []
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", *flags, "--", *program], capture_output=True,
                       text=True, cwd=tmp_path, env=_env(), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.mark.parametrize("how", ["Trainer", "accelerate launch"])
def test_trainer_and_accelerate_launch_under_run_check_saved(library, tmp_path, how):
    pytest.importorskip("transformers" if how == "Trainer" else "accelerate")
    script = tmp_path / "train.py"
    script.write_text(TRAINER if how == "Trainer" else ACCELERATE)
    if how == "Trainer":
        program = [sys.executable, str(script), str(tmp_path / "out")]
    else:
        program = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)]
    plain, _ = _under_run(None, program, tmp_path)
    checked, err = _under_run("warn", program, tmp_path)
    assert plain == checked and len(plain) >= 3
    counts = [line for line in err.splitlines() if line.startswith("torchgen-patch: saved-tensor check in pid")]
    assert counts and all(": 0 changed saved tensors (0 distinct) in " in c for c in counts), err[-2000:]
    assert "saved tensor changed" not in err


def test_fsdp2_on_two_ranks_under_the_check_gives_the_same_losses_and_no_finding(library, tmp_path):
    import torch

    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    rep = tmp_path / "fsdp2.md"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "fsdp2_two_ranks.py"), "--device", "cpu",
                        "--check-saved", "raise", "--report", str(rep)], capture_output=True, text=True,
                       timeout=900, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    text = rep.read_text()
    assert "identical: **yes**" in text
    assert "- patched: the saved-tensor check on (raise) in every rank: 0 findings" in text


DEEPSPEED = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    import torchgen_patch
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.lion import DeepSpeedCPULion

    OPTIMIZERS = {"DeepSpeedCPUAdam(adamw_mode=True)": lambda ps: DeepSpeedCPUAdam(ps, lr=0.1, adamw_mode=True),
                  "DeepSpeedCPUAdam(adamw_mode=False)": lambda ps: DeepSpeedCPUAdam(ps, lr=0.1, adamw_mode=False),
                  "DeepSpeedCPUAdagrad": lambda ps: DeepSpeedCPUAdagrad(ps, lr=0.1),
                  "DeepSpeedCPULion": lambda ps: DeepSpeedCPULion(ps, lr=0.1)}

    def between(make, check, step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        opt = make(list(model.parameters()))
        x = torch.randn(3, 4)
        model(x).sum().backward()
        versions = [p._version for p in model.parameters()]
        def go():
            loss = model(x).pow(2).sum()
            if step:
                opt.step()
            loss.backward()
            return [p.grad.tolist() for p in model.parameters()]
        try:
            if check:
                with torchgen_patch.check_saved("raise") as c:
                    grads = go()
                return {"outcome": "silent", "findings": len(c.findings), "grads": grads}
            grads = go()
            return {"outcome": "silent", "grads": grads, "bumped": [p._version for p in model.parameters()] != versions}
        except torchgen_patch.saved.SavedTensorChanged as e:
            f = e.finding
            return {"outcome": "finding", "optimizer": f.optimizer, "writers": [str(w) for w in f.writers],
                    "name": f.name, "message": str(e)}
        except RuntimeError as e:
            return {"outcome": "raises", "message": str(e)}

    out = {}
    for name, make in OPTIMIZERS.items():
        out[name] = {"unchecked": between(make, False, True), "checked": between(make, True, True),
                     "checked, no step": between(make, True, False), "no step": between(make, False, False)}
    rep = torchgen_patch.install(library=sys.argv[2])  # with the optimizer entries: a step bumps each parameter
    assert not rep.refused, rep.summary()
    for name, make in OPTIMIZERS.items():
        out[name]["patched"] = between(make, False, True)
        out[name]["patched, checked"] = between(make, True, True)
    print(json.dumps(out))
""")


def test_deepspeed_cpu_optimizers_stepped_between_forward_and_backward(library):
    """DeepSpeed's CPU optimizers (the optimizers of ZeRO-Offload) write the parameters through pybind-bound
    C++: a step moves no version, so a step between forward and backward is silent; under the check it is
    a finding naming the optimizer; installed, the overlay's optimizer entries bump each parameter once per
    step and autograd refuses with its own error. Their C++ ops are built by DeepSpeed on first use, into
    $TORCH_EXTENSIONS_DIR (.cache/torch_extensions for the test session)."""
    pytest.importorskip("deepspeed")
    r = subprocess.run([sys.executable, "-c", DEEPSPEED, ROOT, library.path], capture_output=True, text=True,
                       timeout=1800,
                       env=_env(DS_BUILD_OPS="0"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    classes = {"DeepSpeedCPUAdam": "deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam",
               "DeepSpeedCPUAdagrad": "deepspeed.ops.adagrad.cpu_adagrad.DeepSpeedCPUAdagrad",
               "DeepSpeedCPULion": "deepspeed.ops.lion.cpu_lion.DeepSpeedCPULion"}
    assert len(out) == 4
    for name, runs in out.items():
        assert runs["unchecked"]["outcome"] == "silent" and not runs["unchecked"]["bumped"], name
        assert runs["unchecked"]["grads"] != runs["no step"]["grads"], name  # backward used the stepped values
        found = runs["checked"]
        assert found["outcome"] == "finding", (name, found)
        assert found["optimizer"] == classes[name.split("(")[0]] and found["writers"][0] == "optimizer", found
        assert re.search(rf"the optimizer {re.escape(found['optimizer'])}, whose step( at \S+:\d+ \([^)]*\))? ran "
                         "between save and use", found["message"]), found["message"]
        assert runs["checked, no step"] == {"outcome": "silent", "findings": 0, "grads": runs["no step"]["grads"]}
        # installed, the overlay's optimizer entries bump the parameters once per step: autograd's own error,
        # checked or not (the check leaves to autograd what autograd sees)
        for run in ("patched", "patched, checked"):
            assert runs[run]["outcome"] == "raises", (name, run, runs[run])
            assert "modified by an inplace operation" in runs[run]["message"], runs[run]
