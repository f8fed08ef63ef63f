"""Speed tricks for SAC's gradient steps, some on private torch APIs.

bfloat16 hidden matmuls where the CPU multiplies them natively, Adam's fused kernel called
without ``Optimizer.step``'s Python bookkeeping, and the Polyak average in one foreach call.
Each is pinned against the plain torch path in test/test_sac.py (bit for bit where it can be),
so a torch upgrade that changes a private API fails there, not silently.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (oneDNN sees AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def matmul_dtype(name: str) -> torch.dtype | None:
    """``sac.matmul_dtype`` -> the hidden layers' dtype (None: float32 as stored); ``auto`` is
    bfloat16 where the CPU computes it natively (AVX512-BF16 / AMX), else float32 (as PyTorch
    picks TF32 for float32 matmuls on GPUs that have it)."""
    native = native_bfloat16()
    if name == 'float32' or (name == 'auto' and not native):
        return None
    # bfloat16 without native CPU support is emulated: slower, not wrong.
    if not native:
        warnings.warn('sac.matmul_dtype: bfloat16 has no native support on this CPU (no '
                      'AVX512-BF16 / AMX): the gradient steps get slower, not faster; set '
                      'sac.matmul_dtype: float32', stacklevel=2)
    return torch.bfloat16


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, every parameter in one foreach call."""
    # lerp: target + tau (source - target) = (1 - tau) target + tau source
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


@torch.no_grad()
def fused_adam_step(optimizer: torch.optim.Adam) -> None:
    """``optimizer.step()`` then ``zero_grad()`` for a ``fused=True`` Adam, minus the Python
    bookkeeping of ``Optimizer.step`` (~0.3 ms per call here, as long as the kernel itself).

    The same kernel on the optimiser's own state (bit-identical results, state_dict unchanged);
    the first step (state not yet created) and unsupported options go through ``step()``.
    """
    state = optimizer.state
    for group in optimizer.param_groups:
        params = [p for p in group['params'] if p.grad is not None]
        if group['amsgrad'] or group['maximize'] or group.get('decoupled_weight_decay') or any(
                p not in state for p in params):
            optimizer.step()
            optimizer.zero_grad()
            return
    for group in optimizer.param_groups:
        params = [p for p in group['params'] if p.grad is not None]
        if not params:
            continue
        states = [state[p] for p in params]
        steps = [s['step'] for s in states]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group['betas']
        torch._fused_adam_(params, [p.grad for p in params], [s['exp_avg'] for s in states],
                           [s['exp_avg_sq'] for s in states], [], steps, amsgrad=False,
                           lr=group['lr'], beta1=beta1, beta2=beta2,
                           weight_decay=group['weight_decay'], eps=group['eps'],
                           maximize=False, grad_scale=None, found_inf=None)
        for p in params:
            p.grad = None
