"""The local learning coefficient (LLC) of any course model, estimated with ``devinterp`` (chapter 14).

The LLC of Lau et al. (2023) measures how degenerate the loss is around a set of weights ``w*``:
sample weights ``w`` from the tempered, localized posterior

    p(w) ∝ exp(-nβ L(w) - γ/2 |w - w*|²)

with SGLD, and ``λ̂ = nβ (E[L(w)] - L(w*))``. A sharp, full-rank minimum of ``d`` parameters gives
about ``d/2``; every flat direction lowers it. ``devinterp`` (Timaeus) does the sampling; this module
is the one adapter between it and the course's model interface, and copies nothing of its sampler.

Why an adapter: devinterp takes any model with ``cfg.n_heads`` for a TransformerLens model, moves it
with ``model.to(device, print_details=False)`` and calls ``model(ids, return_type="logits")``, both
TypeErrors on ours. :class:`_Plain` hides the config and returns logits, and the per-token loss is
passed as ``loss_fn``. devinterp also averages a chain that stopped on a NaN loss (its trace is
NaN-filled past the failure and the mean skips NaN); :func:`estimate_llc` reads every chain's trace
itself, names the failed ones and leaves them out.

devinterp is an optional extra (``pip install 'attncircuits[stages]'``): nothing else of the course
imports it, and :func:`require_devinterp` says how to install it.

:func:`hessian_trace` is the independent estimate beside it: Hutchinson's ``E[vᵀHv] = tr H`` with
Rademacher ``v``, from double backpropagation. Near a quadratic minimum the LLC is about half the
number of directions the loss curves in, so the two move together; where they part, the LLC sees
what the second derivative cannot.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from attncircuits.models.parts import loss_fn as mean_loss

#: the pin of the optional extra (pyproject.toml's ``stages``; requirements.txt)
DEVINTERP_REQUIREMENT = "devinterp==2.0.1"
#: how to get it, in every message that needs it
INSTALL = f"from the repository root run `pip install -e '.[stages]'` (without it: `pip install {DEVINTERP_REQUIREMENT}`)"


def require_devinterp():
    """devinterp's sampling module, or a ModuleNotFoundError saying how to install it."""
    try:
        return importlib.import_module("devinterp.slt.sampling")
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("devinterp"):
            raise
        raise ModuleNotFoundError(f"the LLC needs the optional package devinterp; install it with {INSTALL}, "
                                  "then restart the kernel") from None


@dataclass(frozen=True)
class SamplerSettings:
    """SGLD settings of one estimate; the defaults are chapter 14's calibration (see there)."""

    lr: float = 1e-4  # ε, the step size
    localization: float = 1000.0  # γ, the pull back to w*
    n_beta: float = 1000.0  # nβ, the inverse temperature times the sample size
    chains: int = 2
    draws: int = 100
    batch_size: int = 16
    burnin: int = 0
    seed: int = 100

    def check(self) -> None:
        for name in ("lr", "n_beta"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"SamplerSettings.{name} must be a number > 0 (got {v!r})")
        if not (isinstance(self.localization, (int, float)) and math.isfinite(self.localization)
                and self.localization >= 0):
            raise ValueError(f"SamplerSettings.localization must be a number >= 0 (got {self.localization!r})")
        for name in ("chains", "draws", "batch_size"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"SamplerSettings.{name} must be a whole number >= 1 (got {v!r})")
        if not (isinstance(self.burnin, int) and self.burnin >= 0):
            raise ValueError(f"SamplerSettings.burnin must be a whole number >= 0 (got {self.burnin!r})")


@dataclass
class LLCEstimate:
    """One estimate: ``llc`` is the mean over the chains that finished (``failed`` names the others,
    with the step where each stopped); ``trace[chain, step]`` is the sampled loss (NaN past a failure)."""

    llc: float
    llc_std: float
    per_chain: list[float]
    init_loss: float
    trace: np.ndarray = field(repr=False)
    failed: dict[int, int]
    seconds: float
    settings: SamplerSettings

    @property
    def rise(self) -> float:
        """How far the loss rose while sampling (nats): the last quarter's mean minus ``init_loss``."""
        ok = self.trace[[c for c in range(len(self.trace)) if c not in self.failed]]
        return float(ok.mean(0)[-max(1, ok.shape[1] // 4):].mean() - self.init_loss) if len(ok) else math.nan

    @property
    def verdict(self) -> str:
        """:func:`verdict` of the whole trace: a failed chain makes it ``"diverged"``."""
        return verdict(self.trace, self.init_loss)

    @property
    def plateaued(self) -> bool:
        return self.verdict == "flat"

    def summary(self) -> dict:
        """The numbers a results file keeps (the trace as its mean over chains, 20 points)."""
        s = self.settings
        mean = np.nanmean(self.trace, axis=0) if np.isfinite(self.trace).any() else self.trace[0]
        pts = np.linspace(0, len(mean) - 1, min(20, len(mean))).round().astype(int)
        return {"llc": self.llc, "llc_std": self.llc_std, "per_chain": self.per_chain, "init_loss": self.init_loss,
                "rise": self.rise, "verdict": self.verdict, "plateaued": self.plateaued, "failed": {str(k): v for k, v in self.failed.items()},
                "seconds": self.seconds, "trace_steps": pts.tolist(), "trace": [float(mean[i]) for i in pts],
                "settings": asdict(s)}


def llc_from_trace(trace, init_loss: float, n_beta: float) -> float:
    """``nβ (mean sampled loss - L(w*))`` of each chain of ``trace[chain, step]``, averaged over the
    chains whose trace is finite throughout (a chain with a NaN or infinite loss diverged and is
    left out, never averaged in); NaN when every chain diverged."""
    t = np.asarray(trace, dtype=float)
    ok = np.isfinite(t).all(axis=1)
    if not ok.any():
        return math.nan
    return float((n_beta * (t[ok].mean(axis=1) - init_loss)).mean())


def verdict(trace, init_loss: float) -> str:
    """Chapter 14's rule for a sampler setting, from its loss trace ``[chain, step]``:

    * ``"diverged"``: a NaN or infinite loss anywhere (a chain failed);
    * ``"negative"``: the mean sampled loss is below ``L(w*)`` (a negative estimate: ``w*`` is not
      a local minimum for this sampler, or the step is too large to see it);
    * ``"not flat"``: the chains' mean over the last quarter differs from the third quarter's by
      more than 10% of the rise (last quarter minus ``L(w*)``) and more than three standard errors
      of batch noise (:func:`batch_noise`): the loss is still moving;
    * ``"flat"``: none of these, the estimate can be read."""
    t = np.asarray(trace, dtype=float)
    if not np.isfinite(t).all():
        return "diverged"
    if t.mean() < init_loss:
        return "negative"
    q = max(1, t.shape[1] // 4)
    rise = t.mean(0)[-q:].mean() - init_loss
    if plateau_gap(t) > max(0.1 * abs(rise), 3 * batch_noise(t)):
        return "not flat"
    return "flat"


def plateau_gap(trace: np.ndarray) -> float:
    """|mean of the last quarter - mean of the third quarter| of ``trace[chain, step]``, the chains
    averaged (NaN when a chain failed)."""
    n = trace.shape[1]
    q = max(1, n // 4)
    mean = trace.mean(0)
    return float(abs(mean[-q:].mean() - mean[n - 2 * q:n - q].mean()))


def batch_noise(trace: np.ndarray) -> float:
    """The standard error of the difference of two quarter means of ``trace[chain, step]`` from its
    step-to-step scatter (half the spread of successive differences, which ignores a slow trend)."""
    mean = trace.mean(0)
    q = max(1, len(mean) // 4)
    sd = float(np.diff(mean).std() / math.sqrt(2)) if len(mean) > 2 else 0.0
    return sd * math.sqrt(2 / q)


class _Plain(nn.Module):
    """The course model seen by devinterp as a plain module: no ``cfg`` attribute (which would make it
    a TransformerLens model there), ``forward(ids) -> logits``. Parameters are shared, not copied."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.inner = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids)


def _per_token_loss(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, pos - 1]`` next-token cross-entropy, the loss_fn devinterp asks for."""
    return mean_loss(model(input_ids).float(), input_ids, per_token=True)


def token_dataset(tokens: torch.Tensor, batch_size: int):
    """The rows of ``tokens [n, pos]`` as the HuggingFace Dataset devinterp samples from."""
    import datasets  # devinterp's own dependency

    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [rows, pos] with pos >= 2, got shape {tuple(tokens.shape)}")
    if tokens.shape[0] < batch_size:
        raise ValueError(f"{tokens.shape[0]} rows of tokens are fewer than one batch of {batch_size}; "
                         f"pass at least {batch_size} rows or a batch_size <= {tokens.shape[0]}")
    ds = datasets.Dataset.from_dict({"input_ids": tokens.long().tolist()})
    return ds.with_format("torch")


_HEAD_WEIGHT = re.compile(r"blocks\.(\d+)\.(?:attn\.)?(W_[QKVO])$")


def head_masks(model: nn.Module, heads) -> dict[str, torch.Tensor]:
    """devinterp's ``param_masks`` for the weight-refined LLC of ``heads`` (``[(layer, head), ...]``):
    only their ``W_Q, W_K, W_V, W_O`` slices move, every other weight stays at ``w*``."""
    masks: dict[str, torch.Tensor] = {}
    wanted = {(int(l), int(h)) for l, h in heads}
    for name, p in model.named_parameters():
        m = _HEAD_WEIGHT.search(name)
        if m is None:
            continue
        mask = torch.zeros_like(p, dtype=torch.bool)
        for l, h in wanted:
            if l == int(m.group(1)):
                mask[h] = True
        if mask.any():
            masks["inner." + name] = mask
    found = {(int(_HEAD_WEIGHT.search(n[6:]).group(1)), h) for n, mk in masks.items() for h in range(mk.shape[0])
             if mk[h].any()}
    if missing := sorted(wanted - found):
        raise ValueError(f"the model has no attention weights for heads {missing}")
    return masks


def estimate_llc(model: nn.Module, tokens: torch.Tensor, settings: SamplerSettings | None = None,
                 heads=None, device: str = "cpu", progress: bool = True) -> LLCEstimate:
    """The LLC of ``model`` at its current weights, on the rows of ``tokens [n, pos]`` (devinterp's SGLD
    draws batches of ``settings.batch_size`` from them); with ``heads``, the weight-refined LLC of
    those heads only. The model is not changed (devinterp samples on a copy).

    A chain whose loss became NaN or infinite stops there; it is named in ``failed`` and left out of
    ``llc``. When every chain failed this raises a ValueError naming the settings to change.
    ``progress=False`` hides devinterp's progress bars (written to stderr)."""
    settings = settings or SamplerSettings()
    settings.check()
    sampling = require_devinterp()
    from devinterp.slt.llc import compute_llc

    ds = token_dataset(tokens, settings.batch_size)
    plain = _Plain(model)
    masks = head_masks(model, heads) if heads is not None else None
    out = tempfile.mkdtemp(prefix="llc-")
    t0 = time.perf_counter()
    was_grad = torch.is_grad_enabled()
    torch.set_grad_enabled(True)  # a chapter may have switched gradients off for its analysis
    try:
        quiet = contextlib.redirect_stderr(io.StringIO()) if not progress else contextlib.nullcontext()
        with warnings.catch_warnings(record=True) as caught, quiet:
            warnings.simplefilter("always")
            samples = sampling.sample(
                plain, ds, {}, lr=settings.lr, n_beta=settings.n_beta, localization=settings.localization,
                num_chains=settings.chains, num_draws=settings.draws, batch_size=settings.batch_size,
                num_burnin_steps=settings.burnin, init_seed=settings.seed, param_masks=masks,
                num_init_loss_batches=min(8, len(ds) // settings.batch_size), device=device,
                output_path=f"{out}/samples.zarr", loss_fn=_per_token_loss)
            res = compute_llc(samples).load()
        trace = np.asarray(res.loss_trace.values, dtype=float)
        per_chain = np.asarray(res.llc_per_chain.values, dtype=float)
        init = float(res.init_loss)
    finally:
        torch.set_grad_enabled(was_grad)
        shutil.rmtree(out, ignore_errors=True)
    for w in caught:  # devinterp's own messages, but not its note on a chain it caught (named below)
        if "Chain failed" not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    bad = ~np.isfinite(trace)
    failed = {c: int(np.argmax(bad[c])) for c in range(len(trace)) if bad[c].any()}
    ok = [c for c in range(len(trace)) if c not in failed]
    s = settings
    if not ok:
        raise ValueError(f"every chain diverged (NaN or infinite loss at steps {sorted(failed.values())}) "
                         f"with lr={s.lr}, localization={s.localization}, n_beta={s.n_beta}; "
                         "lower lr or raise localization")
    vals = per_chain[ok]
    return LLCEstimate(float(vals.mean()), float(vals.std()) if len(vals) > 1 else 0.0, vals.tolist(), init,
                       trace, failed, time.perf_counter() - t0, s)


def hessian_trace(model: nn.Module, tokens: torch.Tensor, probes: int = 8, batch_size: int = 16,
                  seed: int = 0) -> tuple[float, float]:
    """(tr H, its standard error): Hutchinson's estimate of the trace of the Hessian of the mean
    next-token loss on ``tokens`` (one batch of ``batch_size`` rows per probe), ``E[vᵀHv]`` over
    Rademacher vectors ``v``, each ``Hv`` by double backpropagation."""
    if tokens.shape[0] < batch_size:
        raise ValueError(f"{tokens.shape[0]} rows of tokens are fewer than one batch of {batch_size}; "
                         f"pass at least {batch_size} rows or a batch_size <= {tokens.shape[0]}")
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(seed)
    vals = []
    # the fused CPU attention kernel has no second derivative: the plain one does the same sums
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        for i in range(probes):
            rows = torch.randperm(tokens.shape[0], generator=g)[:batch_size]
            batch = tokens[rows]
            grads = torch.autograd.grad(mean_loss(model(batch), batch), params, create_graph=True)
            vs = [torch.randint(0, 2, p.shape, generator=g).to(p.dtype) * 2 - 1 for p in params]
            hv = torch.autograd.grad(grads, params, grad_outputs=vs)
            vals.append(sum(float((v * h).sum()) for v, h in zip(vs, hv)))
    a = np.asarray(vals)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else math.nan
