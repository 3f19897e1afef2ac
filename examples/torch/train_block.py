"""Train a small transformer (two pre-norm blocks) twice from the same initial weights and data: once with numbatma's
attention and linear layers (numbatma.kernels.torch: differentiable torch ops on numbatma's forward and backward
kernels), once with torch's SDPA and linear - both under torch.compile(fullgraph=True) - and compare the loss curves
(JSON, and a PNG when matplotlib is installed). Needs a Hopper GPU and torch.

    python examples/torch/train_block.py [--steps 300] [--out train_block] [--device cpu]

The task: predict the next token of random sequences whose second half repeats the first (a copy task attention
solves). The first half's tokens are random, so the loss there stays at ln 256 = 5.55 whatever the model does; the
second half's ("copy loss", reported and plotted separately) falls towards 0 once attention finds the earlier copy.

Mixed precision as in a real training run: the parameters (and AdamW's state) stay float32 - in bfloat16, an update
smaller than half a weight's last bit is rounded away - while every linear layer and the attention run in bfloat16
on bfloat16 copies of their inputs and weights, made by the same explicit casts in both runs (so that both feed
their ops the same tensors); layer norms, the residual stream and the loss stay float32. Positions are learned
embeddings. (The first version, with bfloat16 parameters and no positional embedding, hardly learned: 5.71 -> 5.57
in 300 steps on an H200.)

The two runs round differently (different kernels), and the sudden drop of the copy loss (once attention finds the
copy) amplifies that: around it their curves may part by a few steps. Compare them once both have settled - the
summary's mean |difference| over the last 20 steps.

``--device cpu`` trains torch's run only, on the CPU (numbatma's needs a Hopper GPU): a check of the model and the
task on a machine without one.
"""
import argparse
import json
import math

import torch

# Sizes and learning rate from torch's run on the CPU (2026-11-28): the copy loss stays at ln 256 for a while, then
# drops within some 20 steps, as attention finds the copy - with batches of 64 sequences of 128 tokens (data and
# initial seeds 0 and 1) it leaves ln 256 around step 100 and is below 0.04 by step 120; with 32 x 128 around step
# 150, with 16 x 128 at 240-310, with the first version's 16 x 256 not in 300 steps (at 16 x 128, LR 5e-3: later,
# 340-400; 1e-2: not in 300 steps).
VOCAB, DIM, HEADS, SEQ, BATCH, LAYERS = 256, 256, 4, 128, 64, 2
LR, WARMUP = 3e-3, 30  # AdamW's peak learning rate, reached after WARMUP steps, then a cosine decay to a tenth
COMPUTE = torch.bfloat16  # the dtype of the linear layers' and the attention's inputs

ntorch = None  # numbatma.kernels.torch, imported by main() for numbatma's run (torch's run does not need it)


def linear(x, layer, use_numbatma):
    """``layer(x)`` in bfloat16: x, the weight and the bias cast (the casts are differentiable: the float32
    parameters get the gradients), the product on numbatma's Gemm or on torch's linear."""
    x, weight, bias = x.to(COMPUTE), layer.weight.to(COMPUTE), layer.bias.to(COMPUTE)
    if use_numbatma:
        return ntorch.linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


class Block(torch.nn.Module):
    def __init__(self, use_numbatma):
        super().__init__()
        self.use_numbatma = use_numbatma
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.up, self.down = torch.nn.Linear(DIM, 4 * DIM), torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, s, d = x.shape
        qkv = linear(self.norm1(x), self.qkv, self.use_numbatma)  # (bfloat16: q, k and v are in COMPUTE already)
        q, k, v = qkv.view(b, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        if self.use_numbatma:
            o = ntorch.attention(q, k, v, causal=True)
        else:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + linear(o.transpose(1, 2).reshape(b, s, d), self.proj, self.use_numbatma)  # (float32 residual)
        hidden = torch.nn.functional.gelu(linear(self.norm2(x), self.up, self.use_numbatma))
        return x + linear(hidden, self.down, self.use_numbatma)


class Model(torch.nn.Module):
    def __init__(self, use_numbatma):
        super().__init__()
        self.use_numbatma = use_numbatma
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.position = torch.nn.Embedding(SEQ, DIM)  # (a token's copy is SEQ / 2 back: findable by position)
        self.blocks = torch.nn.ModuleList(Block(use_numbatma) for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)
        for table in (self.embed, self.position):  # (std 0.02, not N(0, 1): about the blocks' output scale)
            torch.nn.init.normal_(table.weight, std=0.02)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return linear(self.norm(x), self.head, self.use_numbatma)


def batches(steps, device, seed=0):
    """``steps`` batches of BATCH sequences of SEQ tokens: SEQ / 2 random ones, repeated (the same in every run)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for _ in range(steps):
        half = torch.randint(0, VOCAB, (BATCH, SEQ // 2), device=device, generator=gen)
        yield torch.cat([half, half], 1)


def schedule(steps):
    """The learning rate's factor at each step: linear warm-up over WARMUP steps, then a cosine decay to 0.1."""
    def factor(step):
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP)))
    return factor


def train(use_numbatma, steps, device):
    """Trains a fresh model (seed 0: the same initial weights in every run) for ``steps`` steps; returns the loss
    and the copy loss (the second half's targets) of each step."""
    torch.manual_seed(0)
    model = Model(use_numbatma).to(device)  # (float32 parameters)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    lr = torch.optim.lr_scheduler.LambdaLR(opt, schedule(steps))
    step = torch.compile(model, fullgraph=True)
    curves = {"loss": [], "copy_loss": []}
    for tokens in batches(steps, device):
        logits = step(tokens[:, :-1])
        losses = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1),
                                                   reduction="none").view(BATCH, SEQ - 1)
        loss = losses.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lr.step()
        # (targets SEQ / 2 - 1 on are tokens SEQ / 2 on: the repeated half; the first half's cannot be predicted)
        curves["loss"].append(loss.item())
        curves["copy_loss"].append(losses[:, SEQ // 2 - 1:].mean().item())
    return curves


def main():
    global ntorch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="train_block")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: torch's run only, on the CPU (a check of the model and the task without a GPU)")
    args = parser.parse_args()
    runs = ("numbatma", "torch") if args.device == "cuda" else ("torch",)
    if "numbatma" in runs:
        import numbatma.kernels.torch as ntorch
    curves = {name: train(name == "numbatma", args.steps, args.device) for name in runs}
    report(curves, args.out, dict(vocab=VOCAB, dim=DIM, heads=HEADS, seq=SEQ, batch=BATCH, layers=LAYERS, lr=LR,
                                  warmup=WARMUP, steps=args.steps, device=args.device))


def report(curves, out, config):
    """Writes ``out``.json (the configuration and each run's curves) and ``out``.png; prints each run's losses and,
    for two runs, the mean |difference| of their curves over the last 20 steps."""
    with open(out + ".json", "w") as f:
        json.dump({"config": config, **curves}, f)
    floor = math.log(VOCAB)
    for name, c in curves.items():
        mid = len(c["loss"]) // 2
        print(f"{name:9s} loss: first {c['loss'][0]:.3f}, step {mid} {c['loss'][mid]:.3f}, last {c['loss'][-1]:.3f}; "
              f"copy loss (second half): first {c['copy_loss'][0]:.3f}, step {mid} {c['copy_loss'][mid]:.3f}, last "
              f"{c['copy_loss'][-1]:.3f}")
    print(f"(random start and first half's floor: ln {VOCAB} = {floor:.2f}; a model that copies the second half "
          f"perfectly: loss {floor * (SEQ // 2 - 1) / (SEQ - 1):.2f}, copy loss 0)")
    if len(curves) == 2:
        (name_a, a), (name_b, b) = curves.items()
        gaps = {key: sum(abs(x - y) for x, y in zip(a[key][-20:], b[key][-20:])) / len(a[key][-20:])
                for key in ("loss", "copy_loss")}
        print(f"mean |{name_a} - {name_b}| over the last 20 steps: loss {gaps['loss']:.4f}, copy loss "
              f"{gaps['copy_loss']:.4f}")
    plot(curves, floor, out + ".png")


def plot(curves, floor, path):
    """Each run's loss (solid) and copy loss (dashed) against the step, with ln VOCAB; for two runs a second panel
    with their difference (on top of each other in the first, the curves hide it). Skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    two = len(curves) == 2
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(12 if two else 7, 4.2), squeeze=False)
    ax = axes[0][0]
    for (name, c), color in zip(curves.items(), ("tab:blue", "tab:orange")):
        ax.plot(c["loss"], color=color, label=f"{name}: loss")
        ax.plot(c["copy_loss"], color=color, linestyle="--", label=f"{name}: copy loss (second half)")
    ax.axhline(floor, color="gray", linewidth=0.8, linestyle=":", label=f"ln {VOCAB} (chance)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend(fontsize=8)
    if two:
        (name_a, a), (name_b, b) = curves.items()
        ax = axes[0][1]
        for key, style in (("loss", "-"), ("copy_loss", "--")):
            ax.plot([x - y for x, y in zip(a[key], b[key])], color="black", linestyle=style, linewidth=0.8,
                    label=key.replace("_", " "))
        ax.set_xlabel("step")
        ax.set_ylabel(f"{name_a} - {name_b}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
