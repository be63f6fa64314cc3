"""Training runs for the saved-tensor check's no-false-findings tests, in one fresh process:

    python tests/saved_training.py CHECK(off|warn|raise|default) CASE[,CASE...]|all [DEVICE]

installs the kernels (the library at $TORCHGEN_PATCH_LIBRARY, else the cached build), turns the
check on in that mode when asked, trains each case a few steps from fixed seeds and prints one
JSON object: case -> {"losses": [...], "findings": n, "checked": n}. ``default``: the check the
process already has (``torchgen-patch run`` with no flag: warn, sampled), else that default turned on
here, one check for all the cases; each case also says its draws (drawn, draws, every) so far. Every
case runs on DEVICE (default cpu; on cuda AMP is bf16 autocast there, with PyTorch's deterministic
algorithms where it has them) with tiny configurations built in code (no download): small GPT-2, BERT and Llama models
of transformers, and a ResNet-18 written here (torchvision does not import beside torch 2.13).
tests/test_saved_training.py runs it with the check off and on and compares; so does
scripts/unseen_writes.py on CUDA."""

from __future__ import annotations

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


def _quiet_transformers():
    from transformers.utils import logging

    logging.set_verbosity_error()


def gpt2(seed=0, device="cpu"):
    from transformers import GPT2Config, GPT2LMHeadModel

    _quiet_transformers()
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=64, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(device)
    ids = torch.randint(0, 64, (2, 16), device=device)
    return model, lambda: model(ids, labels=ids).loss


def bert(seed=0, device="cpu"):
    from transformers import BertConfig, BertForMaskedLM

    _quiet_transformers()
    torch.manual_seed(seed)
    cfg = BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                     vocab_size=64, max_position_embeddings=32)
    model = BertForMaskedLM(cfg).to(device)
    ids = torch.randint(0, 64, (2, 16), device=device)
    return model, lambda: model(input_ids=ids, labels=ids).loss


def llama(seed=0, device="cpu"):
    from transformers import LlamaConfig, LlamaForCausalLM

    _quiet_transformers()
    torch.manual_seed(seed)
    cfg = LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=32,
                      intermediate_size=64, vocab_size=64, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg).to(device)
    ids = torch.randint(0, 64, (2, 16), device=device)
    return model, lambda: model(input_ids=ids, labels=ids).loss


class Block(torch.nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        nn = torch.nn
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.short(x))


class ResNet18(torch.nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, classes)

    def forward(self, x):
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def resnet18(seed=0, device="cpu"):
    torch.manual_seed(seed)
    model = ResNet18().to(device)
    x, y = torch.randn(2, 3, 32, 32, device=device), torch.randint(0, 10, (2,), device=device)
    return model, lambda: torch.nn.functional.cross_entropy(model(x), y)


# case -> (model, optimizer options, AMP, gradient clipping, gradient checkpointing, torch.compile)
CASES = {
    "gpt2-fused-clip": (gpt2, {"fused": True}, False, True, False, False),
    "gpt2-foreach-amp-checkpointing": (gpt2, {"foreach": True}, True, False, True, False),
    "bert-foreach-amp-clip": (bert, {"foreach": True}, True, True, False, False),
    "bert-fused": (bert, {"fused": True}, False, False, False, False),
    "llama-foreach-checkpointing-clip": (llama, {"foreach": True}, False, True, True, False),
    "llama-fused-amp": (llama, {"fused": True}, True, False, False, False),
    "resnet18-fused-amp-clip": (resnet18, {"fused": True}, True, True, False, False),
    "resnet18-foreach": (resnet18, {"foreach": True}, False, False, False, False),
    "gpt2-compiled-fused": (gpt2, {"fused": True}, False, True, False, True),
}


def train(case: str, device: str = "cpu") -> list[float]:
    make, opt_kw, amp, clip, ckpt, compiled = CASES[case]
    model, loss_of = make(device=device)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **opt_kw)
    step_loss = torch.compile(loss_of) if compiled else loss_of
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            loss = step_loss()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def _under_the_default(case: str, device: str) -> dict:
    """``case`` under the check the process has (``run``'s default, else turned on here as run would): what
    it found and compared while the case ran, and its draws so far."""
    from torchgen_patch.saved import DEFAULT_EVERY, enable

    check = enable("warn", every=DEFAULT_EVERY, quiet=True)  # the check already on, if one is
    findings, checked = len(check.findings), check.checked
    losses = train(case, device)
    return {"losses": losses, "findings": len(check.findings) - findings, "checked": check.checked - checked,
            "skipped": check.skipped, "mode": str(check.mode), "draws": check.sampler.counts()}


def main() -> None:
    mode, cases = sys.argv[1], sys.argv[2].split(",") if sys.argv[2] != "all" else sorted(CASES)
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    if device == "cuda":  # the same losses run to run where PyTorch can give them (cuBLAS: CUBLAS_WORKSPACE_CONFIG)
        torch.use_deterministic_algorithms(True, warn_only=True)
    sys.path.insert(0, ROOT)
    import torchgen_patch

    rep = torchgen_patch.install(library=os.environ.get("TORCHGEN_PATCH_LIBRARY") or None)
    assert not rep.refused, rep.summary()
    out = {}
    for case in cases:
        torch._dynamo.reset()
        if mode == "off":
            out[case] = {"losses": train(case, device), "findings": 0, "checked": 0}
        elif mode == "default":
            out[case] = _under_the_default(case, device)
        else:
            with torchgen_patch.check_saved(mode) as check:
                losses = train(case, device)
            out[case] = {"losses": losses, "findings": len(check.findings), "checked": check.checked,
                         "skipped": check.skipped}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
