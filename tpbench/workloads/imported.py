"""Your own model as a workload: a factory named by import path, e.g. ``"mypkg.bench:build"``.

The protocol is one function. tpbench calls ``build(ctx, **params)`` on every rank for every
repeat, with ``ctx`` a :class:`~tpbench.workloads.WorkloadContext` (rank, world size, per-rank
batch size, seed, device) and ``params`` the suite's ``[workloads."mypkg.bench:build"]`` table.
Every keyword parameter needs a default: the defaults are the workload's defaults, their types
the types a suite may give. It returns a :class:`Bench`.

Before anything runs, the suite check imports the factory and calls it once with
``ctx.device`` the meta device and ``torch.device("meta")`` as the default device (nothing is
allocated, so a model too big for this machine is still checked), then calls ``train_batch(0)``.
Import errors, a factory that raises, exits (``sys.exit``, ``KeyboardInterrupt``) or does not
return within ``tpbench.user_code.LIMIT_S`` (60 s; the import and the call each), a wrong return
value or an unknown parameter stop the sweep there, naming the suite file, key and factory. On
the ranks a model that does not fit in memory fails its case with the cause; the other cases run,
and so does a factory that changes torch's process-wide state (default dtype, thread counts, ...)
or trains into NaN or inf (see ``tpbench.worker``).

The module is imported as ``python -m`` would from the directory tpbench runs in (the rank
processes run there too), or from ``PYTHONPATH``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from tpbench import user_code
from tpbench.workload_params import UserWorkloadError
from tpbench.workloads.base import Workload, WorkloadContext


@dataclass
class Bench:
    """What a factory returns.

    ``model``: on ``ctx.device``, identical on every rank (seed it with ``ctx.seed``).
    ``train_batch(step)``: ``(inputs, targets)`` of that step for this rank, on ``ctx.device``;
    different per rank, reproducible per step (seed a generator with
    ``tpbench.workloads.batch_seed(ctx.seed, ctx.rank, step)``). ``loss(model(inputs), targets)``:
    a scalar. Optional: ``heldout_batches()``, fixed batches equal on every rank (for
    ``eval_every``), and ``optimal_loss``, the best achievable held-out loss when known.
    """

    model: nn.Module
    train_batch: Callable[[int], tuple[Any, Any]]
    loss: Callable[[Any, Any], torch.Tensor]
    heldout_batches: Callable[[], list[tuple[Any, Any]]] | None = None
    optimal_loss: float | None = None


def _import(path: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UserWorkloadError(f"expected a workload name or an import path MODULE:FACTORY, got {path!r}")
    try:
        module = user_code.limited(f"{path} (importing {module_name})", lambda: user_code.import_module(module_name))
    except (ImportError, user_code.UserCodeFailed) as e:
        raise UserWorkloadError(str(e)) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        found = type(factory).__name__ if hasattr(module, attr) else "nothing by that name"  # not "NoneType"
        raise UserWorkloadError(f"expected a function {attr!r} in module {module_name!r}, found {found}")
    return factory


# The types a parameter's default may have: what a suite's TOML can give in its place, and what a
# case records in run.json and hashes into its id (a tuple, a Path or a torch.dtype is neither: a
# list default broke the dataclass, a dtype the record, a tuple could never be set).
_TOML_TYPES = (int, float, bool, str)


def _params_class(path: str, factory: Callable[..., Any]) -> type:
    """A frozen dataclass of the factory's keyword parameters (after ``ctx``), so that suites
    validate ``[workloads."PATH"]`` tables like a built-in workload's."""
    params = list(inspect.signature(factory).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise UserWorkloadError(f"expected {path} to take the WorkloadContext as its first parameter: build(ctx, ...)")
    if params[0].default is not params[0].empty:  # `def build(width=256)`: the ctx would land in width
        raise UserWorkloadError(
            f"expected {path} to take the WorkloadContext as its first parameter: build(ctx, ...); its first "
            f"parameter, {params[0].name!r}, has a default, as a workload parameter does"
        )
    fields = []
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise UserWorkloadError(f"expected named parameters with defaults after ctx in {path}, got {p}")
        if type(p.default) not in _TOML_TYPES:
            found = "none" if p.default is p.empty else f"{type(p.default).__name__} {p.default!r}"
            raise UserWorkloadError(
                f"expected a default (int, float, bool or str) for parameter {p.name!r} of {path}, got {found}"
            )
        fields.append((p.name, type(p.default), dataclasses.field(default=p.default)))
    return dataclasses.make_dataclass("Params", fields, frozen=True)


def _bench(path: str, result: Any) -> Bench:
    if not isinstance(result, Bench):
        raise UserWorkloadError(f"expected {path} to return a tpbench.workloads.Bench, got {type(result).__name__}")
    if not isinstance(result.model, nn.Module):
        raise UserWorkloadError(
            f"expected Bench.model from {path} to be a torch.nn.Module, got {type(result.model).__name__}"
        )
    for name in ("train_batch", "loss"):
        if not callable(getattr(result, name)):
            raise UserWorkloadError(f"expected Bench.{name} from {path} to be callable")
    if result.heldout_batches is not None and not callable(result.heldout_batches):
        raise UserWorkloadError(f"expected Bench.heldout_batches from {path} to be callable or None")
    loss = result.optimal_loss
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss)):
        raise UserWorkloadError(f"expected Bench.optimal_loss from {path} to be a finite number or None, got {loss!r}")
    return result


def imported_workload(path: str) -> type[Workload]:
    """The workload class for a factory's import path (raises :class:`UserWorkloadError`)."""
    factory = _import(path)
    params_cls = _params_class(path, factory)

    class Imported(Workload):
        name = path
        Params = params_cls

        def __init__(self, params: object, ctx: WorkloadContext) -> None:
            super().__init__(params, ctx)
            self.bench = _bench(path, factory(ctx, **dataclasses.asdict(params)))

        def build_model(self) -> nn.Module:
            return self.bench.model

        def train_batch(self, step: int) -> tuple[Any, Any]:
            return self.bench.train_batch(step)

        def loss(self, output: Any, targets: Any) -> torch.Tensor:
            return self.bench.loss(output, targets)

        def heldout_batches(self) -> list[tuple[Any, Any]]:
            return self.bench.heldout_batches() if self.bench.heldout_batches else []

        @property
        def optimal_loss(self) -> float | None:
            return self.bench.optimal_loss

    Imported.__doc__ = factory.__doc__
    return Imported


def check(cls: type[Workload], params: object, batch_size: int) -> None:
    """Call the factory once on the meta device, and its ``train_batch(0)`` and ``heldout_batches()``: the protocol's
    mistakes surface before the sweep, without allocating the model."""
    ctx = WorkloadContext(rank=0, world_size=1, batch_size=batch_size, seed=0, device=torch.device("meta"))

    calling = cls.name  # what raised, named: the factory, or one of the Bench's functions it returned

    def on_meta() -> Any:
        nonlocal calling
        with torch.device("meta"):
            workload = cls(params, ctx)
            calling = f"Bench.train_batch(0) from {cls.name}"
            batch = workload.train_batch(0)
            calling = f"Bench.heldout_batches() from {cls.name}"
            return batch, workload.heldout_batches()

    # What the factory changes of torch's process-wide state is the ranks' concern (the worker
    # fails such a case); here it must not stay behind in the process that validates.
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    try:
        batch, heldout = user_code.limited(cls.name, on_meta)
    except UserWorkloadError:
        raise
    except user_code.UserCodeFailed as e:
        raise UserWorkloadError(f"{e} (called with ctx.device = meta)") from None
    except Exception as e:  # the user's code: report what it raised, where
        raise UserWorkloadError(
            f"{calling} raised {type(e).__name__}: {e}{user_code.raised_at(e)} (called with ctx.device = meta)"
        ) from None
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
    if not (isinstance(batch, tuple) and len(batch) == 2):
        raise UserWorkloadError(
            f"expected Bench.train_batch(step) from {cls.name} to return (inputs, targets), got {type(batch).__name__}"
        )
    if not (isinstance(heldout, (list, tuple)) and all(isinstance(b, tuple) and len(b) == 2 for b in heldout)):
        raise UserWorkloadError(
            f"expected Bench.heldout_batches() from {cls.name} to return a list of (inputs, targets), "
            f"got {type(heldout).__name__}"
        )
