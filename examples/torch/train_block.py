"""Train a small transformer (two pre-norm blocks) for a few hundred steps twice from the same initial weights and
data: once with numbatma's attention and linear layers (numbatma.kernels.torch: differentiable torch ops on numbatma's
forward and backward kernels), once with torch's SDPA and linear - both under torch.compile(fullgraph=True) - and
compare the loss curves (JSON, and a PNG when matplotlib is installed). Needs a Hopper GPU and torch.

    python examples/torch/train_block.py [--steps 300] [--out train_block]

The task: predict the next token of random sequences that repeat their first half (a copy task attention solves).
"""
import argparse
import json
import math

import torch

import numbatma.kernels.torch as ntorch

VOCAB, DIM, HEADS, SEQ, BATCH, LAYERS = 256, 256, 4, 256, 16, 2


class Block(torch.nn.Module):
    def __init__(self, use_numbatma):
        super().__init__()
        self.use_numbatma = use_numbatma
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.up, self.down = torch.nn.Linear(DIM, 4 * DIM), torch.nn.Linear(4 * DIM, DIM)

    def linear(self, x, layer):
        if self.use_numbatma:
            return ntorch.linear(x, layer.weight, layer.bias)
        return torch.nn.functional.linear(x, layer.weight, layer.bias)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.linear(self.norm1(x), self.qkv).view(b, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        if self.use_numbatma:
            o = ntorch.attention(q, k, v, causal=True)
        else:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.linear(o.transpose(1, 2).reshape(b, s, d), self.proj)
        return x + self.linear(torch.nn.functional.gelu(self.linear(self.norm2(x), self.up)), self.down)


class Model(torch.nn.Module):
    def __init__(self, use_numbatma):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block(use_numbatma) for _ in range(LAYERS))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batches(steps, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for _ in range(steps):
        half = torch.randint(0, VOCAB, (BATCH, SEQ // 2), device="cuda", generator=gen)
        yield torch.cat([half, half], 1)


def train(use_numbatma, steps):
    torch.manual_seed(0)
    model = Model(use_numbatma).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(model, fullgraph=True)
    losses = []
    for tokens in batches(steps):
        logits = step(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="train_block")
    args = parser.parse_args()
    curves = {"numbatma": train(True, args.steps), "torch": train(False, args.steps)}
    with open(args.out + ".json", "w") as f:
        json.dump(curves, f)
    for name, losses in curves.items():
        print(f"{name:9s} loss: first {losses[0]:.3f}, step {len(losses) // 2} {losses[len(losses) // 2]:.3f}, "
              f"last {losses[-1]:.3f}")
    gap = max(abs(a - b) for a, b in zip(curves["numbatma"][-20:], curves["torch"][-20:]))
    print(f"largest difference over the last 20 steps: {gap:.3f} (random start: ln {VOCAB} = {math.log(VOCAB):.2f})")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for name, losses in curves.items():
        plt.plot(losses, label=name)
    plt.xlabel("step")
    plt.ylabel("cross-entropy")
    plt.legend()
    plt.savefig(args.out + ".png", dpi=120)


if __name__ == "__main__":
    main()
