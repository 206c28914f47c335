"""Post-local SGD: global gradient allreduce for a while, then only within each node.

The reference for ``torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook``. Until
``start_localSGD_iter`` iterations have run, every bucket is averaged over the global group (plain
DDP). From then on gradients are averaged only inside each node's subgroup (or not at all), and a
model averager (``tpbench.hooks.PeriodicModelAverager``) run after ``optimizer.step()`` brings the
nodes back together every few steps: cross-node traffic drops from every step to every period.

Compatibility with PyTorch, kept on purpose so that ``impl = "torch"`` and ``impl = "tpbench"``
runs are step-for-step identical:

- ``state.iter`` stops counting at ``start_localSGD_iter``: it is a switch, not a step counter.
  Count steps in the training loop (or read the averager's ``step``).
- With ``subgroup=None`` the intra-node subgroup is created lazily, by the hook, on the first
  iteration of local SGD. Creating a group is a collective over the whole world, and every rank
  reaches that bucket of that iteration, so this is safe; it also means a run that never switches
  never creates extra groups (which matters because ``destroy_process_group()`` can hang on Gloo
  once subgroups exist).
- Gradients are divided by the group size *before* the allreduce (PyTorch does so to avoid fp16
  overflow); the same order of operations gives bit-identical results.

Beyond PyTorch: where PyTorch takes the node size from ``torch.cuda.device_count()`` (and fails on
CPU), ``ranks_per_node`` says explicitly which ranks form a node, so 4 CPU ranks on one machine can
behave as 2 nodes x 2 ranks. Without it the real structure is used (``LOCAL_WORLD_SIZE`` as set by
torchrun). An explicit ``ranks_per_node`` is checked when the state is built, so a bad one fails
before training; without one, as in PyTorch, a node size that cannot be told (a CPU process
without ``LOCAL_WORLD_SIZE``) is only a warning until the switch, where it raises.
"""

# No ``from __future__ import annotations`` here: DDP's register_comm_hook compares the hook's
# annotations with the real ``dist.GradBucket`` and ``Future[Tensor]`` objects, and rejects strings.
import logging
import os
import warnings

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def resolve_ranks_per_node(ranks_per_node: int | None = None) -> int:
    """How many consecutive ranks form one node.

    In order: ``ranks_per_node`` when given (emulated nodes, or an explicit override); else
    ``LOCAL_WORLD_SIZE`` (the launcher's view of the real machine); else the number of CUDA devices,
    as PyTorch assumes. On a CPU-only process with none of these there is no node structure to
    guess from, so this raises instead of silently treating the whole world as one node.
    """
    if ranks_per_node is not None:
        if ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
        return ranks_per_node
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local:
        return int(local)
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    raise ValueError(
        "cannot tell which ranks share a node: pass ranks_per_node, or launch with torchrun "
        "(which sets LOCAL_WORLD_SIZE)"
    )


def intra_node_subgroup(ranks_per_node: int | None = None) -> dist.ProcessGroup:
    """This rank's node subgroup: ranks ``[k * n, (k + 1) * n)`` for node ``k`` and ``n`` ranks per node.

    A collective over the default group: every rank must call it, in the same order as its other
    group creations. ``ranks_per_node`` is resolved by :func:`resolve_ranks_per_node`.
    """
    size = resolve_ranks_per_node(ranks_per_node)
    subgroup, _ = dist.new_subgroups(group_size=size)
    return subgroup


class PostLocalSGDState:
    """State of :func:`post_localSGD_hook`: which groups to average over, and when to switch.

    Gradients are all-reduced over ``process_group`` (``None``: the global group) for the first
    ``start_localSGD_iter`` iterations, then over ``subgroup`` (``None``: the intra-node group of
    each machine), or not at all when ``post_local_gradient_allreduce`` is false. Both settings of
    that flag can converge faster, depending on the task.

    ``ranks_per_node`` (tpbench's addition, keyword-only) defines the nodes used when ``subgroup``
    is ``None``; see :func:`resolve_ranks_per_node`. It is ignored when a ``subgroup`` is given.
    """

    __slots__ = (
        "process_group",
        "subgroup",
        "start_localSGD_iter",
        "post_local_gradient_allreduce",
        "ranks_per_node",
        "iter",
    )

    def __init__(
        self,
        process_group: dist.ProcessGroup | None,
        subgroup: dist.ProcessGroup | None,
        start_localSGD_iter: int,
        post_local_gradient_allreduce: bool = True,
        *,
        ranks_per_node: int | None = None,
    ) -> None:
        if start_localSGD_iter < 0:
            raise ValueError(f"start_localSGD_iter must be >= 0, got {start_localSGD_iter}")
        self.process_group = process_group
        self.subgroup = subgroup
        self.start_localSGD_iter = start_localSGD_iter
        self.post_local_gradient_allreduce = post_local_gradient_allreduce
        self.ranks_per_node = None  # only needed to build the subgroup, at the switch
        if subgroup is None and post_local_gradient_allreduce:
            self.ranks_per_node = self._node_size(ranks_per_node, start_localSGD_iter)
        self.iter = 0
        logger.info("Local SGD will be started after %s iterations", start_localSGD_iter)

    @staticmethod
    def _node_size(ranks_per_node: int | None, start_localSGD_iter: int) -> int | None:
        """The node size for the lazy subgroup, checked now where that is safe.

        An explicit ``ranks_per_node`` (tpbench's own argument) that cannot work fails here,
        before training. Without one, PyTorch builds the state whatever the machine and needs a
        node size only at the switch, so code that never switches must not break: a node size
        that cannot be told yet is a warning here and an error at the switch.
        """
        world = dist.get_world_size() if dist.is_initialized() else None
        if ranks_per_node is not None:
            size = resolve_ranks_per_node(ranks_per_node)
            if world is not None and world % size:
                raise ValueError(f"world size {world} is not divisible by ranks_per_node={size}")
            return size
        try:
            size = resolve_ranks_per_node()
        except ValueError as e:
            warnings.warn(
                f"{e}; post_localSGD_hook will raise this when local SGD starts (iteration {start_localSGD_iter})",
                stacklevel=3,
            )
            return None
        if world is not None and world % size:
            warnings.warn(
                f"world size {world} is not divisible by the {size} ranks per node; post_localSGD_hook "
                f"will fail when local SGD starts (iteration {start_localSGD_iter})",
                stacklevel=3,
            )
        return size

    def maybe_increase_iter(self, bucket: dist.GradBucket) -> None:
        """Count one iteration per backward pass, and log when local SGD starts.

        ``is_last()`` marks the last bucket DDP hands the hook in an iteration (the highest index:
        DDP reduces buckets in index order), so counting it counts iterations. The hook calls this
        only before the switch, so ``iter`` stops at ``start_localSGD_iter`` (PyTorch's behaviour).
        """
        if bucket.is_last():
            self.iter += 1
            if self.iter == self.start_localSGD_iter:
                logger.info("Start to apply local SGD after %s iterations.", self.iter)


def _average(group: dist.ProcessGroup | None, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """Average ``tensor`` in place over ``group``; the future yields the averaged tensor."""
    tensor.div_(dist.get_world_size(group))
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def post_localSGD_hook(state: PostLocalSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook running post-local SGD; pair it with a model averager.

    Register with ``ddp_model.register_comm_hook(state, post_localSGD_hook)`` and call
    ``averager.average_parameters(model.parameters())`` after every ``optimizer.step()``, with the
    averager's ``warmup_steps`` equal to ``start_localSGD_iter``. Returns a future that yields the
    bucket's gradients, averaged in place.
    """
    grads = bucket.buffer()
    if state.iter < state.start_localSGD_iter:
        state.maybe_increase_iter(bucket)
        return _average(state.process_group, grads)
    if not state.post_local_gradient_allreduce:
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(grads)
        return done
    if state.subgroup is None:
        state.subgroup = intra_node_subgroup(state.ranks_per_node)
    return _average(state.subgroup, grads)
