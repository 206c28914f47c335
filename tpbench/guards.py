"""What fails a case whose code broke training or the process it shares with the next case.

Non-finite training (``check_finite``): its step times are not those of training and it must
never be ranked. torch's process-wide settings changed by a case's workload factory or hook
(``torch_state``, ``check_torch_state``): they would carry into the next case of the same world.
A hook of the user's own that left the ranks' gradients different (``grad_fingerprint``,
``check_reduced``): it did not reduce them, so its steps are not data-parallel training and its
step times, free of communication, would win every comparison. ``tpbench.worker`` checks these
and fails the case with the cause in run.json.
"""

from __future__ import annotations

from typing import Any

import torch


def check_finite(repeat: int, rank: int, losses: list[torch.Tensor], model: torch.nn.Module) -> None:
    """Non-finite training fails its case (FloatingPointError, the cause in run.json): its step
    times are not those of training (NaN arithmetic, skipped work) and it must never be ranked.
    Checked once per repeat, after the steps: every step's loss, then the parameters (a hook that
    writes NaN into the gradients shows there first)."""
    values = torch.stack(losses).float().cpu()
    bad = (~torch.isfinite(values)).nonzero()
    if len(bad):
        step = int(bad[0])
        raise FloatingPointError(
            f"non-finite training: the loss was {values[step].item()} at step {step} of repeat {repeat} on rank {rank}"
        )
    named = list(model.named_parameters())
    finite = [torch.isfinite(p.detach()).all() for _, p in named]
    if finite and not bool(torch.stack(finite).all()):  # one device sync, not one per parameter
        name = next(n for (n, _), ok in zip(named, finite) if not ok)
        raise FloatingPointError(
            f"non-finite training: parameter {name} holds NaN or inf after repeat {repeat} on rank {rank}"
        )


def grad_fingerprint(model: torch.nn.Module) -> tuple[float, float]:
    """The gradients DDP left after a backward pass, which are the comm hook's results, as two
    numbers (the sum of squares and of absolute values, in float64) that every rank must share: a
    hook that reduces the gradients gives every rank the same ones (DDP keeps the replicas equal
    that way), one that returns its rank's own does not, since each rank trains on its own batch."""
    grads = [p.grad.detach().double() for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0, 0.0
    squares = torch.stack([g.square().sum() for g in grads]).sum()
    absolute = torch.stack([g.abs().sum() for g in grads]).sum()
    return float(squares), float(absolute)  # one device sync each, once per repeat


# Ranks' fingerprints further apart than this share (of the larger) differ. A reducing hook gives
# every rank the same bits; local gradients of different batches differ by percents.
REDUCED_TOLERANCE = 1e-6


def check_reduced(hook: str, repeat: int, fingerprints: list[tuple[float, float] | None]) -> None:
    """Fail the case (on rank 0, with every rank's ``grad_fingerprint`` of the repeat's first
    warm-up step) whose hook left the ranks' gradients different: it did not communicate them."""
    first = fingerprints[0]
    for rank, theirs in enumerate(fingerprints[1:], start=1):
        if first is None or theirs is None:
            return
        if any(abs(a - b) > REDUCED_TOLERANCE * max(abs(a), abs(b)) for a, b in zip(first, theirs)):
            raise RuntimeError(
                f"comm_hook {hook} did not reduce the gradients across the ranks: after it ran in the first "
                f"warm-up step of repeat {repeat}, rank {rank}'s gradient norm was {theirs[0] ** 0.5:.6g} and "
                f"rank 0's {first[0] ** 0.5:.6g}; without communication its step times are not those of "
                "data-parallel training"
            )


def torch_state() -> dict[str, Any]:
    """torch's process-wide settings that one case's code (its workload factory, its hook) could
    change and that would otherwise carry into the next case of the same world."""
    return {
        "default dtype": torch.get_default_dtype(),
        "default device": torch.get_default_device(),
        "intra-op thread count": torch.get_num_threads(),
        "inter-op thread count": torch.get_num_interop_threads(),
        "grad mode": torch.is_grad_enabled(),
        "deterministic algorithms flag": torch.are_deterministic_algorithms_enabled(),
        "deterministic algorithms warn-only flag": torch.is_deterministic_algorithms_warn_only_enabled(),
        "anomaly detection": torch.is_anomaly_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "cuDNN benchmark flag": torch.backends.cudnn.benchmark,
        "cuDNN deterministic flag": torch.backends.cudnn.deterministic,
    }


def check_torch_state(before: dict[str, Any]) -> None:
    """Fail the item (its case, with the cause) when it left torch's process-wide state changed;
    the launcher then runs the remaining cases in a fresh world, which starts clean."""
    after = torch_state()
    changed = [f"{k} from {_shown(before[k])} to {_shown(after[k])}" for k in before if after[k] != before[k]]
    if changed:
        raise RuntimeError(f"the case (its workload factory or hook) changed torch's {'; '.join(changed)}")


def _shown(value: Any) -> str:
    return str(value).removeprefix("torch.")
