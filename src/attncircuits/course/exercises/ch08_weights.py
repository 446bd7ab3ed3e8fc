"""Chapter 8's checks, reading the learner's hand-built weights rather than only what they do:
the angle each sinusoid pair of a previous-token head's ``W_Q W_Kᵀ`` is turned by (8.1), and where a
copying head's ``W_V W_O`` reads and writes (8.2), so that a message can name the pair or the
dimensions that are wrong."""

from __future__ import annotations

import torch
from torch import Tensor

from attncircuits.models import handbuilt
from attncircuits.models.handbuilt import Layout


def dims(idx) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (runs of consecutive numbers as ranges)."""
    idx, runs = sorted(int(i) for i in idx), []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


ANGLE_TOL = 1e-3  # radians: a right answer's angles agree with the sinusoids' to float precision


def pair_angles(W_Q: Tensor, W_K: Tensor, layout: Layout) -> tuple[Tensor, Tensor]:
    """(angle, size) of each sinusoid pair's 2x2 block of ``W_Q W_Kᵀ`` on the positional dims: the
    angle the query's pair is turned by against the key's (+w for a query that points one position
    back) and how large the block is. A product, so the same for any basis inside the head."""
    pos, n = layout.pos, layout.n_pos_pairs
    A = W_Q[pos].double() @ W_K[pos].double().T
    f = torch.arange(n)
    B = A.view(n, 2, n, 2)[f, :, f, :]  # [pair, 2, 2]: rows (sin, cos) of the query, columns of the key
    rot, anti = (B[:, 0, 0] + B[:, 1, 1]) / 2, (B[:, 0, 1] - B[:, 1, 0]) / 2
    return torch.atan2(anti, rot), torch.hypot(rot, anti)


def wrap(x: Tensor) -> Tensor:
    return torch.atan2(torch.sin(x), torch.cos(x))


def angle_problem(W_Q: Tensor, W_K: Tensor, layout: Layout, score: str) -> str | None:
    """What is wrong with the pairs the head uses or the angles they are turned by; None when every
    pair is turned by its own frequency (read off the case's sinusoids)."""
    n = layout.n_pos_pairs
    w = handbuilt.positional_frequencies(handbuilt.empty_model(layout, 1).W_pos, n).double()
    theta, size = pair_angles(W_Q, W_K, layout)
    used = size > 1e-6 * float(size.max()) if float(size.max()) > 0 else size > 0
    if int(used.sum()) < n:
        missing = torch.nonzero(~used).flatten().tolist()
        return (f"{score}: your weights use only {int(used.sum())} of the {n} sinusoid pairs (pair{'s' * (len(missing) > 1)} "
                f"{dims(missing)} left out): use every one of the first n_pairs pairs. Fewer pairs repeat "
                "sooner, so on a longer context a far position looks like the previous one")
    if bool((wrap(theta - w).abs() < ANGLE_TOL).all()):
        return None
    if bool((wrap(theta + w).abs() < ANGLE_TOL).all()):
        return (f"{score}: transpose your rotation (the query must point one position back). Yours turns "
                "each pair forward, so query i points at position i + 1, which the causal mask hides, and "
                "the head looks mostly at the token itself; W_Q's 2x2 block for a pair is the transpose "
                "of the rotation printed above")
    if bool((theta.abs() < ANGLE_TOL).all()):
        return (f"{score}: the query is not rotated (every pair is turned by 0), so the head looks mostly "
                "at the token itself. Rotate the query's (sin, cos) pairs back by one position's angle, "
                "w, leave the key as it is")
    k = theta / w
    if n > 1 and abs(round(float(k[0]))) >= 2 and bool((wrap(theta - round(float(k[0])) * w).abs() < ANGLE_TOL).all()):
        k = round(float(k[0]))
        where = f"{k} positions back" if k > 0 else f"{-k} positions forward"
        return (f"{score}: every pair is turned by {k} times its frequency, so the query points {where}: "
                "turn each pair by one position's angle, its own w")
    if n > 1 and float(wrap(theta - theta[0]).abs().max()) < ANGLE_TOL:
        return (f"{score}: every pair is turned by the same angle, {float(theta[0]):.3f} rad, but each pair "
                f"turns by its own frequency w per position (here {float(w.max()):.3f} down to "
                f"{float(w.min()):.3f} rad), so the pairs point at different positions: read each pair's "
                "angle off W_pos[1]")
    off = wrap(theta - w).abs()
    f = int(off.argmax())
    return (f"{score}: pair {f} is turned by {float(theta[f]):.3f} rad, but its frequency is "
            f"{float(w[f]):.3f} rad ({int((off >= ANGLE_TOL).sum())} of the {n} pairs are off): turn each "
            "pair by its own w, read off W_pos[1]")


def looks_forward(W_Q: Tensor, W_K: Tensor, layout: Layout) -> bool:
    """Whether the query's best key, the causal mask left out, is mostly the next position."""
    W_pos = handbuilt.empty_model(layout, 1).W_pos[:, layout.pos]
    logits = (W_pos @ W_Q[layout.pos]) @ (W_pos @ W_K[layout.pos]).T
    offsets = torch.arange(layout.n_ctx) - logits.argmax(-1)  # query - best key
    return float((offsets == -1).float().mean()) > 0.5


def shapes(got, expected) -> str | None:
    """A message when ``W_V`` or ``W_O`` is transposed or of another shape than the reference's."""
    for name, mine, want in zip(("W_V", "W_O"), got, expected):
        if tuple(mine.shape) != tuple(want.shape):
            sizes = "[d_model, d_head]" if name == "W_V" else "[d_head, d_model]"
            if tuple(mine.shape) == tuple(want.shape)[::-1]:
                return (f"{name} has shape {list(mine.shape)}: it is transposed; {name} is {sizes} = "
                        f"{list(want.shape)}")
            return f"{name} has shape {list(mine.shape)}, expected {sizes} = {list(want.shape)}"
    return None


def where_copied(ov: Tensor, src: slice, dst: slice) -> str | None:
    """Which rows (dims read) and columns (dims written) of ``W_V @ W_O`` are wrong, in the
    residual stream's dimensions; None when nothing specific is found."""
    d, n = ov.shape[0], src.stop - src.start
    nz = ov.abs() > 1e-5
    rows, cols = torch.nonzero(nz.any(1)).flatten(), torch.nonzero(nz.any(0)).flatten()
    block = torch.zeros(d, d, dtype=torch.bool)
    block[src, dst] = True
    want_rows, want_cols = torch.arange(src.start, src.stop), torch.arange(dst.start, dst.stop)

    def shifted(got, want):  # k when the dims are want shifted by k, else None
        if len(got) == len(want) and len(got) and bool((got - want == got[0] - want[0]).all()) and got[0] != want[0]:
            return int(got[0] - want[0])
        return None

    s_rng, d_rng = f"{src.start}-{src.stop - 1}", f"{dst.start}-{dst.stop - 1}"
    if bool((nz & ~block).any()):
        if torch.equal(rows, want_rows) and torch.equal(cols, want_rows):
            return f"it copies src into src itself (writes dims {s_rng}, not dst's {d_rng})"
        k = shifted(cols, want_cols)
        if torch.equal(rows, want_rows) and k is not None:
            return f"it writes dims {dims(cols)}: dst shifted by {k:+d} (dst is dims {d_rng})"
        k = shifted(rows, want_rows)
        if torch.equal(cols, want_cols) and k is not None:
            return f"it reads dims {dims(rows)}: src shifted by {k:+d} (src is dims {s_rng})"
        out_rows = torch.nonzero((nz & ~block).any(1)).flatten()
        out_cols = torch.nonzero((nz & ~block).any(0)).flatten()
        return (f"non-zero outside the src->dst block (src dims {s_rng} to dst dims {d_rng}): reads dims "
                f"{dims(out_rows)} into dims {dims(out_cols)}")
    B = ov[src, dst]
    diag, off = B.diagonal(), B - torch.diag(B.diagonal())
    if float(off.abs().max()) <= 1e-5:
        ones = (diag - 1).abs() <= 1e-5
        if int(ones.sum()) < n and bool(((diag.abs() <= 1e-5) | ones).all()):
            left = torch.nonzero(~ones).flatten() + src.start
            return f"{int(ones.sum())} of {n} dims copied (src dims {dims(left)} are not)"
        return None
    is_perm = bool(((B - 1).abs() <= 1e-5).sum(0).eq(1).all() and ((B - 1).abs() <= 1e-5).sum(1).eq(1).all()
                   and int((B.abs() > 1e-5).sum()) == n)
    if is_perm:
        to = ((B - 1).abs() <= 1e-5).float().argmax(1)  # src dim i goes to dst dim to[i]
        k = int(to[0])
        if bool((to == (torch.arange(n) + k) % n).all()):
            return (f"src dim {src.start} goes to dst dim {dst.start + k}, src dim {src.start + 1} to "
                    f"{dst.start + (1 + k) % n}, ...: a permutation shifted by {k if k <= n // 2 else k - n:+d}, "
                    "not the identity")
        return (f"a permutation, not the identity: src dim {src.start + int((to != torch.arange(n)).float().argmax())} "
                f"goes to dst dim {dst.start + int(to[int((to != torch.arange(n)).float().argmax())])}")
    extra = torch.nonzero(off.abs() > 1e-5)
    i, j = int(extra[0, 0]), int(extra[0, 1])
    return (f"{len(extra)} non-zero entr{'ies' if len(extra) > 1 else 'y'} off the diagonal of the src->dst "
            f"block (the first: src dim {src.start + i} to dst dim {dst.start + j})")
