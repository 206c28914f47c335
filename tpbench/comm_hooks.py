"""The DDP communication hook of a case: the suite keys ``comm_hook`` and ``comm_hook_state``.

This module names and validates hooks without importing torch (except to check what this torch
can run when a suite asks for bf16 or a hook of one's own); ``tpbench.training`` wires them into DDP.

PyTorch's ZeRO hooks are wrappers, ``hook_with_zero_step(hook, ddp, zero, shard_buckets)``, and
which ``hook`` they wrap decides how many bytes each bucket sends, hence on which side of the
documented interleaved/sequential advice a setup falls. So the hook is a dimension like any other:

- ``ddp`` and ``zero_no_overlap`` (and post-local SGD with ``start_localSGD_iter = "never"``, which
  is plain DDP) register it on DDP directly; ``"allreduce"`` registers nothing, leaving DDP's
  built-in all-reduce (what ``allreduce_hook`` reproduces, per PyTorch's docs).
- ``hook_with_zero_step`` and ``hook_with_zero_step_interleaved`` wrap it; ``"allreduce"`` wraps
  ``allreduce_hook``.
- post-local SGD after its switch: ``post_localSGD_hook`` is itself the registered hook (its state
  is a ``PostLocalSGDState``) and takes no inner hook, so only compression composes with it,
  through PyTorch's documented ``fp16_compress_wrapper`` / ``bf16_compress_wrapper`` around it. A
  hook of one's own cannot be composed there and is refused at validation.

bf16 compression is refused at validation where PyTorch cannot run it (see ``Bf16Support``): on
NCCL older than 2.10, and, registered on DDP directly, on a torch built without CUDA/NCCL (a CPU
build), where DDP itself refuses the hook by name. Wrapped by a ZeRO hook it runs there on Gloo.

A hook of one's own is named by import path, ``"mypkg.hooks:my_hook"``, and optionally a state
factory, ``comm_hook_state = "mypkg.hooks:make_state"``, called on every rank with the case's
process group (``None``: the default group); without one the hook's state is that process group,
as for PyTorch's default hooks. The module is imported as ``python -m`` would from the directory
tpbench runs in (the rank processes run there), or from ``PYTHONPATH``.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from tpbench import user_code


class HookedCase(Protocol):
    """What the hook checks read of a case (``suite.Case`` has it): typed against this rather than
    the suite's class because the suite imports this module."""

    @property
    def backend(self) -> str: ...
    @property
    def comm_hook(self) -> str: ...
    @property
    def comm_hook_state(self) -> str | None: ...


ALLREDUCE = "allreduce"
BUILTIN = (ALLREDUCE, "fp16_compress", "bf16_compress")
EXPECTED = '"allreduce", "fp16_compress", "bf16_compress" or an import path "MODULE:FUNCTION"'
STATE_EXPECTED = '"none" or an import path "MODULE:FACTORY" of a function (process_group) -> state'
NO_STATE = "none"
NCCL_BF16 = (2, 10)  # PyTorch's bf16_compress_hook "requires NCCL version later than 2.9.6"

_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class CommHookError(ValueError):
    """An import path that does not name a usable hook or state factory (the message says why)."""


def is_import_path(name: Any) -> bool:
    return isinstance(name, str) and ":" in name


def valid_name(v: Any) -> bool:
    """What the suite accepts for ``comm_hook``: a built-in name or a well-formed import path."""
    return isinstance(v, str) and (v in BUILTIN or bool(_PATH.fullmatch(v)))


def valid_state(v: Any) -> bool:
    return isinstance(v, str) and (v == NO_STATE or bool(_PATH.fullmatch(v)))


def moot(params: dict[str, Any]) -> frozenset[str]:
    """``comm_hook_state`` means something only for a hook of one's own, and only when given."""
    if not is_import_path(params.get("comm_hook")) or params.get("comm_hook_state") in (None, NO_STATE):
        return frozenset({"comm_hook_state"})
    return frozenset()


@functools.cache
def load(path: str, arguments: int) -> Callable[..., Any]:
    """The function ``path`` names, checked to accept ``arguments`` positional arguments."""
    module_name, _, attr = path.partition(":")
    try:
        module = user_code.limited(f"{path} (importing {module_name})", lambda: user_code.import_module(module_name))
    except (ImportError, user_code.UserCodeFailed) as e:
        raise CommHookError(str(e)) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CommHookError(f"module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        kind = type(obj).__name__
        raise CommHookError(f"{path!r} is {'an' if kind[:1] in 'aeiou' else 'a'} {kind}, not a function")
    try:
        inspect.signature(obj).bind(*([None] * arguments))
    except TypeError:
        raise CommHookError(f"{path!r} cannot be called with {arguments} positional argument(s)") from None
    except ValueError:
        pass  # no signature to inspect (some builtins): the call will tell
    return obj


@dataclass(frozen=True)
class Bf16Support:
    """What decides whether bfloat16 compression can run: PyTorch's DDP registers
    ``bf16_compress_hook`` (or its wrapper) only on a torch built for CUDA or ROCm with NCCL >= 2.10,
    or for XPU with XCCL, whatever the backend (``DistributedDataParallel._check_comm_hook``, by the
    hook's name); NCCL all-reduces bfloat16 from 2.10. Gloo all-reduces bfloat16 on CPU."""

    gpu_build: bool
    nccl: tuple[int, ...] | None
    xccl: bool
    torch_version: str = ""

    @classmethod
    def detect(cls) -> Bf16Support:
        import torch
        import torch.distributed as dist

        nccl = tuple(torch.cuda.nccl.version()) if dist.is_available() and dist.is_nccl_available() else None
        xccl = dist.is_available() and getattr(dist, "is_xccl_available", lambda: False)() and torch.xpu.is_available()
        return cls(torch.version.cuda is not None or torch.version.hip is not None, nccl, bool(xccl), torch.__version__)

    def refusal(self, backend: str, wrapped: bool) -> str | None:
        """Why bf16_compress cannot run here, or None. ``wrapped``: the hook is wrapped (by a ZeRO
        hook) rather than registered on DDP itself, so DDP's name check does not see it."""
        nccl_ok = self.nccl is not None and self.nccl >= NCCL_BF16
        if backend == "nccl" and not nccl_ok:
            have = ".".join(map(str, self.nccl)) if self.nccl else "none"
            return f"bf16_compress: NCCL all-reduces bfloat16 from 2.10 on; this torch has NCCL {have}"
        if not wrapped and not ((self.gpu_build and nccl_ok) or self.xccl):
            return (
                "bf16_compress: PyTorch's DDP registers bf16 compression only on a torch built with CUDA 11+ and "
                f"NCCL 2.10+ (or XPU and XCCL), and this torch ({self.torch_version or 'unknown'}) is not; "
                "the ZeRO hooks, which wrap the hook, can use it (Gloo all-reduces bfloat16)"
            )
        return None


def ddp_refusal(hook: Callable[..., Any]) -> str | None:
    """Why DDP's ``register_comm_hook`` would refuse ``hook``, or None. DDP looks the hook's second
    parameter up by the name ``bucket`` and compares its annotations with real types
    (``DistributedDataParallel._check_comm_hook``): refused there, every rank of every such case fails
    with a bare ``KeyError: 'bucket'`` or ValueError, so the suite is refused up front instead."""
    import torch
    import torch.distributed as dist

    try:
        sig = inspect.signature(hook)
    except ValueError:
        return None  # no signature to inspect (some builtins): DDP says why when it registers it
    bucket = sig.parameters.get("bucket")
    if bucket is None:
        return f"names its parameters ({', '.join(sig.parameters)}): DDP requires the second one to be named 'bucket'"
    if bucket.annotation not in (inspect.Parameter.empty, dist.GradBucket):
        return _annotated("bucket", bucket.annotation, "dist.GradBucket")
    if sig.return_annotation not in (inspect.Signature.empty, torch.futures.Future[torch.Tensor]):
        return _annotated("its return", sig.return_annotation, "torch.futures.Future[torch.Tensor]")
    return None


def _annotated(what: str, got: Any, expected: str) -> str:
    """DDP's annotation rule broken; a string annotation is what ``from __future__ import annotations`` makes."""
    lazy = " (a string: the hook's module has `from __future__ import annotations`?)" if isinstance(got, str) else ""
    return f"annotates {what} as {got!r}{lazy}: DDP requires {expected} or no annotation"


def check(case: HookedCase, wrapped: bool) -> tuple[str, str] | None:
    """Why the case's hook cannot run, as (key, reason), or None. ``wrapped``: the algorithm wraps
    the hook (the ZeRO hooks) instead of registering it on DDP. Imports torch only for bf16 and the
    user's own hooks, where what this torch can run decides."""
    name = case.comm_hook
    if name == "bf16_compress":
        why = Bf16Support.detect().refusal(case.backend, wrapped)
        if why:
            return "comm_hook", why
    if is_import_path(name):
        try:
            hook = load(name, 2)
        except CommHookError as e:
            return "comm_hook", f"expected a function (state, bucket) -> Future: {e}"
        why = None if wrapped else ddp_refusal(hook)
        if why:
            return "comm_hook", f"expected a function (state, bucket) -> Future that DDP registers: {name!r} {why}"
    if case.comm_hook_state is not None:
        try:
            load(case.comm_hook_state, 1)
        except CommHookError as e:
            return "comm_hook_state", f"expected a function (process_group) -> state: {e}"
    return None
