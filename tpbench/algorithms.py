"""The table of sweepable algorithms: what each is, which suite keys it uses, what it refuses.

Declarations only, without torch: the suite validates against them, the report orders and
compares cases by them, and ``tpbench validate`` / ``tpbench report`` never pay for importing
torch. How each algorithm wraps a model lives in ``tpbench.training``, which only the worker
imports.

Each ``Algorithm`` declares which algorithm-specific suite keys it uses (``uses``); the suite
collapses the others so that, say, ``shard_buckets`` never doubles the ``ddp`` cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from tpbench import comm_hooks


class CheckedCase(comm_hooks.HookedCase, Protocol):
    """What an algorithm's checks read of a case (``suite.Case`` has it): typed against this rather
    than the suite's class because the suite imports this table."""

    @property
    def warmup_steps(self) -> int: ...
    @property
    def impl(self) -> str | None: ...
    @property
    def world_size(self) -> int: ...
    @property
    def shard_buckets(self) -> bool | None: ...
    @property
    def start_localSGD_iter(self) -> int | str | None: ...
    @property
    def steps(self) -> int: ...
    @property
    def static_graph(self) -> bool: ...
    @property
    def find_unused_parameters(self) -> bool: ...


# Keys that only some algorithms use; every other case key applies to all of them.
ALGORITHM_SPECIFIC_KEYS = frozenset(
    {
        "impl",
        "shard_buckets",
        "start_localSGD_iter",
        "post_local_gradient_allreduce",
        "averaging_period",
        "ranks_per_node",
        "parameters_as_bucket_view",
    }
)
# What a user tunes; every other varying parameter describes the setting (world, link, workload),
# within which "fastest" is a recommendation.
TUNING_KEYS = ALGORITHM_SPECIFIC_KEYS | {
    "algorithm",
    "bucket_cap_mb",
    "bucket_cap_mb_list",
    "gradient_as_bucket_view",
    "static_graph",
    "find_unused_parameters",
    "comm_hook",
    "comm_hook_state",
}


@dataclass(frozen=True)
class Algorithm:
    name: str
    description: str
    uses: frozenset[str] = field(default_factory=frozenset)
    # A short word for it in the report's sentences ("" → its name), spelled out once beside them.
    short: str = ""
    # ZeRO's overlap hooks spend their first iterations collecting buckets; fewer warm-up steps
    # would time vacuous iterations.
    min_warmup_steps: int = 0
    # Backends on which PyTorch's own implementation runs (impl = "torch"); empty: no torch impl.
    torch_impl_backends: frozenset[str] = frozenset()
    # Keys that stop mattering for some values of others (returns the keys to collapse).
    moot: Callable[[dict[str, Any]], frozenset[str]] = lambda params: frozenset()
    # Whether the case registers a hook of the algorithm's own that takes no inner hook: then only
    # compression composes with it (see tpbench.comm_hooks), not a comm_hook of the user's.
    own_hook: Callable[[CheckedCase], bool] = lambda case: False
    # Whether the comm_hook is wrapped (the ZeRO hooks) rather than registered on DDP itself.
    wraps_comm_hook: bool = False
    # What else the algorithm refuses of a case, as ``check`` returns it.
    own_check: Callable[[CheckedCase], tuple[str, str] | None] = lambda case: None

    def check(self, case: CheckedCase) -> tuple[str, str] | None:
        """Why ``case`` cannot run with this algorithm, as (key, message), or None."""
        if case.warmup_steps < self.min_warmup_steps:
            return "warmup_steps", f"{self.name} needs at least {self.min_warmup_steps} (got {case.warmup_steps})"
        if case.impl == "torch" and case.backend not in self.torch_impl_backends:
            where = ", ".join(sorted(self.torch_impl_backends)) or "no backend"
            return "impl", f"PyTorch's own {self.name} runs on {where}, not on {case.backend}"
        if case.shard_buckets and case.world_size < 2:
            return "shard_buckets", "sharding buckets needs world_size >= 2"
        if self.own_hook(case) and comm_hooks.is_import_path(case.comm_hook):
            return "comm_hook", (
                f"{self.name} registers its own hook, which takes no inner hook, so a hook of your own cannot be "
                f'composed with it; expected "allreduce", "fp16_compress" or "bf16_compress" (PyTorch\'s '
                f"compression wrappers around it), got {case.comm_hook!r}"
            )
        return self.own_check(case) or comm_hooks.check(case, wrapped=self.wraps_comm_hook)


def _switches_in_time(case: CheckedCase) -> tuple[str, str] | None:
    """Post-local SGD must switch before its last timed step: the hook counts every iteration from
    the first warm-up step, and one that switches later times plain DDP under post-local SGD's name,
    which the report would then judge against DDP as post-local SGD."""
    start, last = case.start_localSGD_iter, case.warmup_steps + case.steps
    if isinstance(start, int) and start >= last:
        return "start_localSGD_iter", (
            f'expected "never" or an integer below {last} (warmup_steps {case.warmup_steps} + steps {case.steps}): '
            f"switching at iteration {start}, every timed step would be plain DDP's, got {start}"
        )
    return None


def _buckets_settle(case: CheckedCase) -> tuple[str, str] | None:
    """The ZeRO hooks initialise ZeRO once DDP has rebuilt its buckets, which DDP never does with
    ``find_unused_parameters`` and no ``static_graph``: the case would time steps that update nothing
    (PyTorch's hooks refuse it as they start). ``static_graph`` lets a model leave the same
    parameters unused in every step without it."""
    if case.find_unused_parameters and not case.static_graph:
        return "find_unused_parameters", (
            "the ZeRO hooks need DDP's buckets to settle, which they never do with find_unused_parameters = true "
            "and static_graph = false; expected static_graph = true with it (a model that leaves the same "
            "parameters unused in every step needs only static_graph = true)"
        )
    return None


_ZERO_HOOK = dict(
    uses=frozenset({"impl", "shard_buckets"}),
    # The first two iterations (three with static_graph) only collect buckets; we ask for three
    # always so that no timed step is a vacuous one.
    min_warmup_steps=3,
    # PyTorch's own ZeRO hooks refuse Gloo ("may meet hangs", pytorch#62300).
    torch_impl_backends=frozenset({"nccl"}),
    wraps_comm_hook=True,
    own_check=_buckets_settle,
)

# In display order: the report sorts algorithms as listed here.
ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("ddp", "DDP all-reduce, full optimizer on every rank"),
        Algorithm(
            "zero_no_overlap",
            "DDP + ZeroRedundancyOptimizer stepped after backward (no overlap); parameters_as_bucket_view packs "
            "its broadcasts into one per rank",
            # The ZeRO hooks broadcast one flat tensor per DDP bucket shard whatever it says: PyTorch
            # ignores parameters_as_bucket_view with overlap_with_ddp, so it is theirs to collapse.
            uses=frozenset({"parameters_as_bucket_view"}),
        ),
        Algorithm(
            "hook_with_zero_step",
            "ZeRO step overlapped with backward: all buckets stepped after the last one is reduced",
            short="sequential",
            **_ZERO_HOOK,
        ),
        Algorithm(
            "hook_with_zero_step_interleaved",
            "ZeRO step overlapped with backward: each bucket stepped as soon as it is reduced",
            short="interleaved",
            **_ZERO_HOOK,
        ),
        Algorithm(
            "post_localSGD_hook",
            "post-local SGD: global gradient averaging until start_localSGD_iter, then node-local, "
            "plus PeriodicModelAverager after the optimizer step",
            uses=frozenset(
                {"impl", "start_localSGD_iter", "post_local_gradient_allreduce", "averaging_period", "ranks_per_node"}
            ),
            torch_impl_backends=frozenset({"gloo", "nccl"}),
            # "never" is plain DDP: nothing local-SGD-specific applies.
            moot=lambda p: (
                frozenset({"impl", "post_local_gradient_allreduce", "averaging_period", "ranks_per_node"})
                if p["start_localSGD_iter"] == "never"
                else frozenset()
            ),
            own_hook=lambda case: case.start_localSGD_iter != "never",
            own_check=_switches_in_time,
        ),
    ]
}

# The ZeRO variants by role: the two overlap hooks and the step after backward they are judged by.
SEQUENTIAL, INTERLEAVED, NO_OVERLAP = "hook_with_zero_step", "hook_with_zero_step_interleaved", "zero_no_overlap"
ZERO_HOOKS = (SEQUENTIAL, INTERLEAVED)
# The algorithm pairs (candidate, baseline) the report compares case by case within a run; a hook
# against zero_no_overlap is against its default, parameters_as_bucket_view = false (one broadcast per
# parameter), and, where the run has it, also against the packed one (report.verdicts.OVERLAP_KINDS).
COMPARED_PAIRS = ((INTERLEAVED, SEQUENTIAL), (SEQUENTIAL, NO_OVERLAP), (INTERLEAVED, NO_OVERLAP))
# zero_no_overlap's key that packs its broadcasts: the hooks' advantage over the unpacked baseline
# is split into packing (packed / unpacked zero_no_overlap) times overlap (hook / packed).
PACKED = "parameters_as_bucket_view"
# Post-local SGD is judged against plain DDP, which it is with start_localSGD_iter = "never".
LOCALSGD, LOCALSGD_BASELINE = "post_localSGD_hook", "ddp"


def is_plain_ddp(params: dict[str, Any]) -> bool:
    """Whether a case is plain DDP: ``ddp``, or post-local SGD that never switches to local SGD."""
    return params["algorithm"] == LOCALSGD_BASELINE or (
        params["algorithm"] == LOCALSGD and params.get("start_localSGD_iter") == "never"
    )


def switches_to_local_sgd(params: Mapping[str, Any]) -> bool:
    """Whether a case is post-local SGD that switches: from then on its gradients cross only the node
    subgroup, whatever its ``averaging_period`` (every step averaging, at 1, still leaves them there)."""
    return params["algorithm"] == LOCALSGD and not is_plain_ddp(dict(params))


def world_group_size(params: Mapping[str, Any]) -> int | None:
    """The size of the one group every collective of a case runs over, where its settings say it: the
    world's, but for post-local SGD that switches (node subgroups beside the world) and a comm hook of
    one's own (which may use any group); None there, or without settings. A world's traces list every
    group made in it, a post-local SGD case's subgroups in a DDP case's traces too, and Gloo's ranges
    name none: this is what tells a DDP case's all-reduces from the subgroups' (``collective_bandwidth``)."""
    if not params or switches_to_local_sgd(params) or comm_hooks.is_import_path(params.get("comm_hook")):
        return None
    return int(params["world_size"])


# What outputs call a plain-DDP post-local SGD case, and the key that name already says.
PLAIN_DDP_NAME, PLAIN_DDP_KEY = "DDP", "start_localSGD_iter"


def display_name(params: Mapping[str, Any]) -> str:
    """A case's algorithm as every output names it (labels, legends, tables, verdicts): the algorithm,
    with ``[torch]`` when PyTorch's own hook ran, or "DDP" for post-local SGD that never switches: it
    registers no hook, and "post_localSGD_hook start_localSGD_iter=never" read as one more post-local
    SGD setting. What a user types to select it (``--filter start_localSGD_iter=never``) is unchanged."""
    if params["algorithm"] == LOCALSGD and is_plain_ddp(dict(params)):
        return PLAIN_DDP_NAME
    impl = params.get("impl")
    # A table's missing impl is NaN, not None: only a named implementation is shown.
    return params["algorithm"] + (f"[{impl}]" if isinstance(impl, str) and impl != "tpbench" else "")


def named_keys(name: str) -> frozenset[str]:
    """The keys a ``display_name`` already says, left out of a label beside it: "DDP" is
    ``start_localSGD_iter = "never"``."""
    return frozenset({PLAIN_DDP_KEY}) if name == PLAIN_DDP_NAME else frozenset()


def timed_before_switch(params: dict[str, Any]) -> int:
    """How many of a case's timed steps run before post-local SGD switches to local SGD (0 for any
    other case, or one that switched during warm-up). The hook counts iterations from the first
    warm-up step, so ``warmup_steps`` and ``steps`` set this share: two runs of one case made with
    other ones time a different mix of global and local steps, a different step time."""
    start = params.get("start_localSGD_iter")
    if params.get("algorithm") != LOCALSGD or not isinstance(start, int) or isinstance(start, bool):
        return 0
    return min(max(0, start - int(params.get("warmup_steps") or 0)), int(params.get("steps") or 0))
