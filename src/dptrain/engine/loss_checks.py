"""Checks of a loss on its first batch, each a clear error with its fix where the loss would
otherwise train wrongly or differently on another device count: a classification loss on
targets it cannot fit, an elementwise loss broadcasting two shapes, a loss whose reduction is
not the one it is taken to have. ``LossAdapter`` (``losses.py``) runs them."""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Callable

import torch

from ..data.batch import batch_size, join_structure, map_tensors, split_structure, tensors_of


def check_class_targets(target: Any, loss: Callable) -> None:
    """What a classification loss's targets must be, seen before the forward (their count is
    taken then): tensors; integer labels as int64 (Keras's and NumPy's int32 are not taken);
    float targets as class probabilities, a row per sample."""
    name = type(loss).__name__
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{name} needs tensor targets, got {type(target).__name__}")
    if not target.is_floating_point() and target.dtype not in (torch.int64, torch.uint8):
        raise TypeError(f"{name} needs labels of dtype int64, got {target.dtype}: give y.long() (NumPy: "
                        f"y.astype(np.int64))")
    if target.is_floating_point() and target.dim() < 2:
        raise ValueError(f"{name} got float targets of shape {tuple(target.shape)}: give class indices as integers "
                         f"(e.g. y.long()), or class probabilities, a row per sample; for regression use "
                         f"loss=nn.MSELoss()")


def classes_last(output: torch.Tensor, target: Any) -> bool:
    """Whether ``output`` holds the class scores in its last dimension for ``target``'s labels,
    and could not hold them in dimension 1: ``(N, T, C)`` for ``(N, T)`` labels (a token
    classifier's logits, as Hugging Face's models give them), not ``(N, C, T)``."""
    return (isinstance(target, torch.Tensor) and not target.is_floating_point() and output.dim() > 2
            and tuple(target.shape) == tuple(output.shape[:-1])
            and tuple(target.shape) != (output.shape[0], *output.shape[2:]))


def check_classification(output: torch.Tensor, target: Any, loss: Callable) -> None:
    """A classification loss on targets it cannot fit is a clear error, not a silent 0."""
    name = type(loss).__name__
    check_class_targets(target, loss)
    if output.dim() < 2 or output.shape[1] < 2:
        raise ValueError(f"{name} needs one score per class in dimension 1 (at least 2 classes); the model gave "
                         f"shape {tuple(output.shape)}, for which the loss is always 0. For regression use "
                         f"loss=nn.MSELoss()")
    labels = (output.shape[0], *output.shape[2:])      # one label per sample (and position)
    if not target.is_floating_point() and tuple(target.shape) != labels:
        if output.dim() > 2 and tuple(target.shape) == tuple(output.shape[:-1]):     # (N, T, C) for (N, T)
            raise ValueError(f"{name} got labels of shape {tuple(target.shape)} for outputs of shape "
                             f"{tuple(output.shape)}: the model gives the class scores in its last dimension, where "
                             f"torch's cross-entropy takes them in dimension 1: pass forward=lambda model, batch: "
                             f"(model(batch[0]).movedim(-1, 1), batch[1]) (a token classifier's (N, T, C) as "
                             f"(N, C, T)), or flatten them, (model(x).flatten(0, -2), y.flatten()), as Hugging "
                             f"Face's do")
        squeezed = target.dim() == len(labels) + 1 and target.shape[-1] == 1
        raise ValueError(f"{name} got labels of shape {tuple(target.shape)} for outputs of shape "
                         f"{tuple(output.shape)}: it takes one label per sample, shape {labels}"
                         + ("; give y.squeeze(-1) (NumPy: y.ravel(); Keras's labels of shape (N, 1))" if squeezed
                            else ""))
    if not target.is_floating_point():
        ignore = getattr(loss, "ignore_index", -100)
        kept = target[target != ignore]
        if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= output.shape[1]):
            bad = int(kept.max()) if int(kept.max()) >= output.shape[1] else int(kept.min())
            raise ValueError(f"{name} got label {bad} for {output.shape[1]} classes (the model gives {output.shape[1]} "
                             f"scores per sample): labels must be in [0, {output.shape[1]}); give the model more "
                             f"outputs, or fix the labels")
    if target.is_floating_point():
        if target.shape != output.shape:
            raise ValueError(f"{name} got float targets of shape {tuple(target.shape)} for outputs of shape "
                             f"{tuple(output.shape)}: give class indices as integers (e.g. y.long()), or class "
                             f"probabilities of the outputs' shape; for regression use loss=nn.MSELoss()")
        sums = target.sum(dim=1)
        if bool((target < 0).any()) or not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            raise ValueError(f"{name} got float targets that are not class probabilities (each row >= 0, "
                             f"summing to 1): for regression use loss=nn.MSELoss(); for labels use integers")


def check_float_targets(target: torch.Tensor, loss: Callable) -> None:
    """A loss torch computes on float targets only (``BCEWithLogitsLoss``, ``BCELoss``,
    ``HuberLoss``) given integer ones: torch's error ("result type Float can't be cast to the
    desired output type Long") names neither; this one names the fix."""
    name = type(loss).__name__
    raise TypeError(f"{name} needs float targets, got {target.dtype}: give y.float() (NumPy: "
                    f"y.astype(np.float32)){'; 0. or 1. per output for a binary classifier' if 'BCE' in name else ''}")


@functools.lru_cache(maxsize=None)
def trains_on_integers(kind: type) -> bool:
    """Whether this torch trains the elementwise loss ``kind`` on integer targets: MSE and L1 do
    in recent versions, so dptrain takes them there; torch 2.3's backward fails ("Found dtype
    Long but expected Float"), so there they are ``check_float_targets``' error, with the fix.
    Asked once per kind, on two numbers (a loss that cannot be made so: not told)."""
    try:
        loss = kind()
    except Exception:       # noqa: BLE001 - a subclass taking arguments: not told
        return True
    try:
        loss(torch.zeros(2, requires_grad=True), torch.zeros(2, dtype=torch.long)).backward()
    except (RuntimeError, TypeError):
        return False
    return True


def check_same_shape(output: torch.Tensor, target: torch.Tensor, loss: Callable) -> None:
    """An elementwise loss on tensors of two shapes broadcasts them: its mean (and what each
    device's part means) then depends on the split. An error, with the fix."""
    name = type(loss).__name__
    try:
        both = tuple(torch.broadcast_shapes(output.shape, target.shape))
    except RuntimeError:
        both = None
    compared = f"PyTorch would broadcast them to {both}, comparing every output with every target" if both \
        else "they do not broadcast"
    fix = "e.g. y.unsqueeze(1) or output.squeeze(1)" if output.numel() == target.numel() else "e.g. y.view_as(output)"
    raise ValueError(f"{name} got outputs of shape {tuple(output.shape)} and targets of shape {tuple(target.shape)}: "
                     f"{compared}; give targets of the outputs' shape ({fix})")


def _weighted(spread: Any) -> bool:
    """Whether two probes with the first half's outputs moved (``_spread_probe``) find the
    whole a mean of the halves under the same weights, as a ratio of sums over the targets
    (tokens not ignored, a mask) is whatever the outputs; a loss coupling samples is not."""
    if any(p is None or abs(p[1] - p[2]) <= 1e-3 * max(abs(p[1]), abs(p[2])) for p in spread):
        return False
    share = [(whole - b) / (a - b) for whole, a, b in spread]      # the first half's weight
    return abs(share[0] - share[1]) <= 1e-3 and -1e-3 <= share[0] <= 1 + 1e-3


def _not_per_sample(name: str, whole: float, a: float, b: float, parts: int, weighted: bool) -> str:
    """Why a loss that is neither the mean nor the sum of its halves' values cannot be cut into
    ``parts``, and the fix: a mean weighted otherwise (``(sum, count)``), or a loss coupling the
    samples (``whole_batch``)."""
    if weighted:
        return (f"the loss {name} is a mean weighted otherwise than by samples (its value on a batch, {whole:.6g}, "
                f"lies between its values on the two halves, {a:.6g} and {b:.6g}, but is not their mean by samples: "
                f"a mean over the tokens not ignored, over a mask, or by class weights), and the batch is cut into "
                f"{parts} parts (devices and processes): each part's mean would weigh as its samples, not as its "
                f"tokens or weights. Return (sum, count), exact however the batch is split, e.g. "
                f"(F.cross_entropy(out, y, ignore_index=-100, reduction='sum'), (y != -100).sum()), or "
                f"(F.nll_loss(out, y, weight=w, reduction='sum'), w[y].sum()); or reduction='mean' trains each "
                f"part on its own mean (as DistributedDataParallel does)")
    return (f"the loss {name} couples the samples of a batch (its value on a batch, {whole:.6g}, is neither the mean "
            f"nor the sum of its values on the two halves, {a:.6g} and {b:.6g}: in-batch negatives, say), and the "
            f"batch is cut into {parts} parts (devices and processes), each of which would see only its own "
            f"samples: pass loss=dptrain.whole_batch({name}) to compute it on the whole batch on every device (the "
            f"training one device gives); a weighted mean returns (sum, count) instead, exact however the batch is "
            f"split; or reduction='mean' trains each part on its own samples (as DistributedDataParallel does)")


def _spread_probe(loss: Callable, output: Any, target: Any, h: int, n: int, seed: int) -> Any:
    """The loss of the batch and of its two halves with the first half's float outputs moved
    far off (fixed noise): ``(whole, first, second)``, or None where it cannot be asked (no
    float output, a value not finite, a loss that fails on it); ``seed`` draws the noise. A
    mean or sum over samples stays the halves' mean or sum, whatever the outputs."""
    g = torch.Generator().manual_seed(seed)

    def far(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or not t.dim():
            return t
        scale = float(t.detach().abs().mean()) + 1.0
        return t + 3 * scale * torch.randn(t.shape, generator=g).to(t.device, t.dtype)
    try:
        with torch.no_grad():
            out_a, out_b = split_structure(output, [h, n - h])
            moved = map_tensors(far, out_a)
            (tgt_a, tgt_b) = split_structure(target, [h, n - h])
            values = [float(loss(join_structure([moved, out_b]), target)), float(loss(moved, tgt_a)),
                      float(loss(out_b, tgt_b))]
    except Exception:       # noqa: BLE001 - a loss that cannot take it: not told
        return None
    return tuple(values) if all(math.isfinite(v) for v in values) else None


def check_reduction(loss: Callable, reduction: str, declared: bool, output: Any, target: Any,
                    value: torch.Tensor, parts: int = 1) -> bool:
    """A loss taken as a mean that returns a sum (or the reverse) would train differently on
    1, 2 and 4 devices. Once, on the first shard: the loss of the whole against the losses of
    its two halves tells which it is (a mean: their weighted mean; a sum: their sum). One that
    is neither couples the samples (in-batch negatives): on ``parts`` > 1 (devices times
    processes) each part alone would see fewer, unless its reduction is declared. False where
    it could not ask yet (a batch of one sample: the trial before training), to ask again."""
    try:
        n = batch_size((output, target)) if isinstance(output, (torch.Tensor, tuple, list, Mapping)) else 0
    except (TypeError, ValueError):
        return True
    if n < 2:
        return False
    if not any(isinstance(t, torch.Tensor) and t.dim() for t in tensors_of(output)):
        return True
    h = n // 2
    with torch.no_grad():
        try:
            (out_a, out_b), (tgt_a, tgt_b) = split_structure(output, [h, n - h]), split_structure(target, [h, n - h])
            a = float(loss(out_a, tgt_a))
            b = float(loss(out_b, tgt_b))
        except Exception:       # a loss that cannot take a part (pairs, a fixed shape...): not told
            return True
    whole = float(value.detach())
    as_mean, as_sum = (a * h + b * (n - h)) / n, a + b

    def near(x: float, y: float) -> bool:
        return abs(x - y) <= 1e-4 * max(abs(x), abs(y), 1e-12)
    name = getattr(loss, "__name__", type(loss).__name__)
    if parts > 1 and not declared:
        # At the start every sample's loss is about the same, so a mean over another count (the
        # tokens not ignored, a mask's ones) looks like the samples' mean: asked again with the
        # first half's outputs far from the others' (two draws), it is not.
        spread = [_spread_probe(loss, output, target, h, n, seed) for seed in (0, 1)]

        def per_sample(whole: float, a: float, b: float) -> bool:
            return near(whole, (a * h + b * (n - h)) / n) or near(whole, a + b)
        neither = [p for p in [(whole, a, b), spread[0]] if p is not None and not per_sample(*p)]
        if neither:
            raise ValueError(_not_per_sample(name, *neither[0], parts, _weighted(spread)))
    if near(as_mean, as_sum) or (near(whole, as_mean) == near(whole, as_sum)):
        return True             # cannot tell (zero loss, or neither): nothing to say
    found = "sum" if near(whole, as_sum) else "mean"
    if found != reduction:
        said = f"reduction={reduction!r}" if declared else "a mean (the default without reduction=)"
        raise ValueError(f"the loss {name} returns a {found} over the samples (its value on a batch is the {found} "
                         f"of its values on the two halves), but is taken as {said}: pass "
                         f"reduction={found!r} so that every device count gives the same training")
    return True
