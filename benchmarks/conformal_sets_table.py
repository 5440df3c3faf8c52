"""Coverage and size of torchcal's conformal sets over seeded random calibration/test splits,
and the AURC tie-invariance case (issue 21). Prints markdown tables; no timing.

    python -m benchmarks.conformal_sets_table
"""

from __future__ import annotations

import math

import torch

from torchcal.functional import aurc, conformal_score_matrix
from torchcal.scaling import conformal_quantile

F64 = torch.float64


def pool_10(P: int, g: torch.Generator):
    z = 1.5 * torch.randn(P, 10, generator=g, dtype=F64)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    return 1.5 * z, y


def pool_100(P: int, g: torch.Generator):
    z = torch.randn(P, 100, generator=g, dtype=F64)
    a = 2 + 6 * torch.rand(P, generator=g, dtype=F64)
    order = torch.argsort(torch.rand(P, 100, generator=g), 1)
    z.scatter_(1, order[:, :3], torch.stack([a, a - 2, a - 3], 1))
    p = torch.tensor([0.85, 0.07, 0.03] + [0.05 / 97] * 97, dtype=F64)
    r = torch.multinomial(p, P, replacement=True, generator=g)
    return 2 * z, order.gather(1, r[:, None])[:, 0]


METHODS = [
    ("LAC", "lac", {}),
    ("APS (randomised)", "aps", {}),
    ("APS (not randomised)", "aps", {"randomized": False}),
    ("RAPS (randomised, lam 0.01, k_reg 5)", "raps", {"lam": 0.01, "k_reg": 5}),
    ("top-k", "topk", {}),
]


def table(logits, y, n: int, S: int, g: torch.Generator, alpha: float = 0.1) -> None:
    P = logits.shape[0]
    u = torch.rand(P, generator=g, dtype=F64)
    perm = torch.argsort(torch.rand(S, P, generator=g), 1)
    cal, test = perm[:, :n], perm[:, n:]
    sid = torch.arange(S).repeat_interleave(n)
    k = math.ceil((n + 1) * 9 / 10)
    print(f"n_cal = {n}, {S} splits, alpha = {alpha}; k / (n + 1) = {k / (n + 1):.5f}")
    print("| method | coverage mean | coverage sd | mean size |")
    print("|---|---:|---:|---:|")
    for name, method, kw in METHODS:
        m = conformal_score_matrix(logits, method, u=u, **kw)
        s = m.gather(1, y[:, None])[:, 0]
        q, _, _ = conformal_quantile(s[cal].reshape(-1), alpha, sid, S)
        cover = (s[test] <= q[:, None]).double().mean(1)
        size = (m[test] <= q[:, None, None]).sum(-1).double().mean(1)
        print(
            f"| {name} | {float(cover.mean()):.4f} | {float(cover.std()):.4f} | "
            f"{float(size.mean()):.2f} |"
        )


def class_conditional(logits, y, n: int, S: int, g: torch.Generator) -> None:
    P, C = logits.shape
    perm = torch.argsort(torch.rand(S, P, generator=g), 1)
    cal, test = perm[:, :n], perm[:, n:]
    m = conformal_score_matrix(logits, "lac")
    s = m.gather(1, y[:, None])[:, 0]
    gid = (torch.arange(S)[:, None] * C + y[cal]).reshape(-1)
    q, _, _ = conformal_quantile(s[cal].reshape(-1), 0.1, gid, S * C)
    q = q.reshape(S, C)
    yt = y[test]
    hit = (s[test] <= q.gather(1, yt)).double()
    oh = torch.nn.functional.one_hot(yt, C).double()
    cov = ((hit[:, :, None] * oh).sum(1) / oh.sum(1)).mean(0)
    size = (m[test] <= q[:, None, :]).sum(-1).double().mean()
    print(
        f"class-conditional LAC: per-class coverage min {float(cov.min()):.4f}, max "
        f"{float(cov.max()):.4f}, mean size {float(size):.2f}"
    )


def aurc_ties() -> None:
    g = torch.Generator().manual_seed(0)
    N = 10_000
    conf = torch.randint(5, 11, (N,), generator=g).to(F64) / 10
    loss = (~(torch.rand(N, generator=g, dtype=F64) < conf * 0.9)).to(F64)

    def row_order(c, lo):
        o = torch.argsort(c, descending=True, stable=True)
        S = torch.cumsum(lo[o], 0)
        return float((S / torch.arange(1, N + 1, dtype=F64)).mean())

    ref = aurc(conf, loss)
    naive, same = [], True
    for _ in range(50):
        o = torch.randperm(N, generator=g)
        naive.append(row_order(conf[o], loss[o]))
        same &= torch.equal(aurc(conf[o], loss[o]), ref)
    up, down = torch.argsort(loss, stable=True), torch.argsort(-loss, stable=True)
    same &= torch.equal(aurc(conf[up], loss[up]), ref) & torch.equal(
        aurc(conf[down], loss[down]), ref
    )
    print(
        f"AURC, 10k confidences on a 0.1 grid: tie-averaged {float(ref):.6f}, bitwise equal over "
        f"50 shuffles and both outcome-sorted orders: {bool(same)}; ties by row order: "
        f"{min(naive):.4f} .. {max(naive):.4f} over the shuffles, "
        f"{row_order(conf[up], loss[up]):.4f} / {row_order(conf[down], loss[down]):.4f} sorted by outcome"
    )


def main() -> None:
    g = torch.Generator().manual_seed(0)
    logits, y = pool_10(2000, g)
    print("## 10 classes, over-confident (logits 1.5 x truth), pool 2000")
    table(logits, y, 500, 1000, g)
    class_conditional(logits, y, 500, 1000, g)
    g = torch.Generator().manual_seed(2)
    logits, y = pool_100(3000, g)
    print("\n## 100 classes, over-confident, varying top-1 confidence, pool 3000")
    table(logits, y, 1000, 100, g)
    print()
    aurc_ties()


if __name__ == "__main__":
    main()
