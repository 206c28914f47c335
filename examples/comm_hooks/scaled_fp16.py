"""Your own DDP communication hook, swept by tpbench (README, "Communication hooks").

    tpbench sweep examples/comm_hooks/suite.toml      # run from the repository root

fp16 compression with a fixed scale: each bucket is multiplied by ``scale / world size`` before
the cast to float16, which keeps small gradients out of fp16's subnormal range (at the price of
overflow for gradients above 65504 / scale × world size), all-reduced, and divided by ``scale``
after. Half the bytes of an fp32 all-reduce, like PyTorch's ``fp16_compress_hook``.

``make_state`` is the hook's state factory (``comm_hook_state``): tpbench calls it on every rank
with the case's process group (None: the default group). No ``from __future__ import
annotations`` here: DDP compares a hook's annotations with real types when it is registered.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class ScaledState:
    process_group: dist.ProcessGroup | None
    scale: float = 1024.0


def make_state(process_group: dist.ProcessGroup | None) -> ScaledState:
    return ScaledState(process_group)


def scaled_fp16_hook(state: ScaledState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = state.process_group or dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.mul(state.scale / dist.get_world_size(group)).to(torch.float16)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        # Only computes: on Gloo a callback must not issue collectives (see tpbench/hooks/zero.py).
        return buffer.copy_(fut.value()[0]).div_(state.scale)

    return fut.then(decompress)
