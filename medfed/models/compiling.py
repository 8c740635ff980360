"""Optional ``torch.compile`` of the model local training runs (``compile = true``): compiled in
place where it works, eager with the reason logged where it does not, never a failed run."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from medfed.models.fedmodel import FedModel

log = logging.getLogger(__name__)

DP_REASON = "not compiled under DP-SGD: Opacus' per-scan gradient hooks need the eager forward"
# What each model object's attempt came to ("": compiled), so the in-process engine's shared
# model is compiled, or refused, once rather than once per site.
_OUTCOMES: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def compile_for_training(
    model: FedModel,
    sample: tuple[torch.Tensor, torch.Tensor],
    autocast: Callable[[], Any],
    *,
    private: bool = False,
) -> str:
    """Compile ``model``'s forward in place (its state-dict keys unchanged) and try one
    training step's forward and backward on ``sample``, so that a compiler failure shows here
    rather than mid-round; the weights, buffers and gradients are left as they were. Returns
    "" when compiled, else why the model stays eager (logged)."""
    if model in _OUTCOMES:
        return _OUTCOMES[model]
    reason = DP_REASON if private else _try_compile(model, sample, autocast)
    if reason:
        log.warning("torch.compile: the model trains eagerly: %s", reason)
    _OUTCOMES[model] = reason
    return reason


def _try_compile(
    model: FedModel, sample: tuple[torch.Tensor, torch.Tensor], autocast: Callable[[], Any]
) -> str:
    kept = {k: v.detach().clone() for k, v in model.state_dict().items()}
    was_training = model.training
    try:
        model.compile()
        model.train()
        x, y = sample
        with autocast():
            logits = model(x).target_logits.float()
        torch.nn.functional.cross_entropy(logits, y).backward()
    except Exception as exc:  # any compiler failure: train eagerly instead
        _uncompile(model)
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    finally:
        model.zero_grad(set_to_none=True)
        model.load_state_dict(kept)
        model.train(was_training)
    return ""


def _uncompile(model: nn.Module) -> None:
    """Undo :meth:`nn.Module.compile` (which keeps the compiled call in this attribute)."""
    model._compiled_call_impl = None


def is_compiled(model: nn.Module) -> bool:
    return getattr(model, "_compiled_call_impl", None) is not None
