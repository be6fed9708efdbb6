"""Peer measurement for issue 41: the `gpt` example's GPT (byte-level tokens, token and position
embeddings, pre-norm blocks of causal self-attention and a GELU MLP, the head tied to the token
embeddings) trained with PyTorch in one process on all cores, to compare with
distribute-candle's runs of `benches/gpt.rs`.

Not part of the build or CI; `cargo bench -p distribute-candle --bench gpt` (so `cargo xtask
bench candle`) runs it in its rounds where python3 imports torch, and prints the ratio measured
in that run. Usage (`pip install torch`, the CPU wheel does):

    python3 crates/candle/benches/peers/torch_gpt.py [--layers 2] [--embd 64] [--heads 4]
        [--block 64] [--batch 32] [--steps 20] [--warmup 3] [--corpus-root .]

Trains on windows of `--block` + 1 bytes drawn from the first 90 % of README.md and docs/*.md
under `--corpus-root` (the example's text), AdamW at lr 3e-3 with weight decay 0.01 (the
example's, candle-nn's betas and eps), the mean next-byte cross-entropy of the whole batch per
step. Times `--steps` steps after `--warmup` unmeasured ones and prints one JSON line:
`{"torch": version, "threads": n, "tokens_per_s": ...}`.
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(embd, eps=1e-5)
        self.c_attn = nn.Linear(embd, 3 * embd)
        self.attn_proj = nn.Linear(embd, embd)
        self.ln_2 = nn.LayerNorm(embd, eps=1e-5)
        self.c_fc = nn.Linear(embd, 4 * embd)
        self.mlp_proj = nn.Linear(4 * embd, embd)

    def forward(self, x, mask):
        b, t, e = x.shape
        h = self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(e, dim=2)
        q, k, v = (z.view(b, t, h, e // h).transpose(1, 2) for z in (q, k, v))
        scores = (q * (1.0 / math.sqrt(e // h))) @ k.transpose(-2, -1) + mask[:t, :t]
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, e)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, embd, heads, block):
        super().__init__()
        self.wte = nn.Embedding(256, embd)
        self.wpe = nn.Embedding(block, embd)
        self.h = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embd, eps=1e-5)
        mask = torch.full((block, block), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x, self.mask)
        # The head tied to the token embeddings.
        return self.ln_f(x) @ self.wte.weight.t()


def read_corpus(root):
    paths = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    return b"".join(p.read_bytes() for p in sorted(paths))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--corpus-root", type=Path, default=Path("."))
    a = p.parse_args()

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    text = read_corpus(a.corpus_root)
    train = torch.tensor(list(text[: len(text) * 9 // 10]), dtype=torch.long)
    model = Gpt(a.layers, a.embd, a.heads, a.block)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, eps=1e-8)
    width = a.block + 1
    gen = torch.Generator().manual_seed(0)

    start = time.perf_counter()
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            start = time.perf_counter()
        at = torch.randint(0, len(train) - width + 1, (a.batch,), generator=gen)
        windows = torch.stack([train[i : i + width] for i in at.tolist()])
        logits = model(windows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    wall = time.perf_counter() - start
    tokens_per_s = a.steps * a.batch * a.block / wall
    print(json.dumps({"torch": torch.__version__, "threads": threads, "tokens_per_s": tokens_per_s}))


if __name__ == "__main__":
    main()
