"""Toy model shared by the LoRA fixture scripts: a stack of nn.Linear projections named like
Gemma 4's (`model.layers.{i}.self_attn.{q,k,v,o}_proj`, `model.layers.{i}.mlp.{gate,up,down}_proj`,
plus an untargeted `model.proj_out`). Layer 1 has no v_proj (like a k_eq_v layer): v := k there.

The Rust twin lives in crates/lora/tests/common/mod.rs; keep both forwards identical.
"""
import torch
import torch.nn as nn

H, Q, K, I, LAYERS = 8, 12, 4, 16, 2  # hidden, q width (= 3·K), k/v width, mlp width


class Attn(nn.Module):
    def __init__(self, has_v):
        super().__init__()
        self.q_proj = nn.Linear(H, Q, bias=False)
        self.k_proj = nn.Linear(H, K, bias=False)
        self.v_proj = nn.Linear(H, K, bias=False) if has_v else None
        self.o_proj = nn.Linear(Q, H, bias=False)

    def forward(self, h):
        q, k = self.q_proj(h), self.k_proj(h)
        v = self.v_proj(h) if self.v_proj is not None else k
        kv = k * v
        return self.o_proj(torch.tanh(q) + torch.cat([kv, kv, kv], dim=-1))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, h):
        return self.down_proj(torch.tanh(self.gate_proj(h)) * self.up_proj(h))


class Layer(nn.Module):
    def __init__(self, has_v):
        super().__init__()
        self.self_attn = Attn(has_v)
        self.mlp = Mlp()

    def forward(self, h):
        h = h + self.self_attn(h)
        return h + self.mlp(h)


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(has_v=(i != 1)) for i in range(LAYERS)])
        self.proj_out = nn.Linear(H, H, bias=False)

    def forward(self, h):
        for layer in self.layers:
            h = layer(h)
        return self.proj_out(h)


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner()

    def forward(self, x):
        return self.model(x)


def loss_fn(y):
    return (y * y).mean()


def build_base(seed=0):
    torch.manual_seed(seed)
    return Toy()


def make_input(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, H, generator=g)
