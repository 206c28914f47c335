"""The commands whose exit code is a verdict: ``tpbench compare`` and ``tpbench gate``; and
``tpbench explain``, which says where the time of a compared pair went."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tpbench.cli.common import EXIT_OK, EXIT_RESULTS, console, given_flags, stop_signals_interrupt, usage


def _print_verdict(comparison, fmt: str, command: str = "compare") -> int:
    from tpbench import explain, render

    comparison = explain.annotate(comparison)  # a regression names its top contributor where traced
    if fmt == "md":  # a CI summary's heading names the command that wrote it
        sys.stdout.write(render.render_markdown(comparison, f"tpbench {command}"))
    else:
        sys.stdout.write(render.RENDERERS[fmt](comparison))
    sys.stdout.flush()
    return comparison.exit_code


def cmd_compare(args: argparse.Namespace) -> int:
    from tpbench import compare, store

    threshold = compare.parse_threshold(args.threshold)
    if len(args.runs) == 1:
        if args.ignore_env:  # the cases of one run share its environment: there is nothing to ignore
            usage(f"--ignore-env: {compare.IGNORE_ENV_WITHIN_RUN}", "compare")
        within = compare.within_run(
            args.runs[0],
            metric=args.metric,
            threshold=threshold,
            fail_on_inconclusive=args.fail_on_inconclusive,
            pairs=args.pair,
            filters=args.filter,
        )
        if not within.pairs:
            # "pass" over no comparison would let a CI job pass on a typo or a one-case run. The cases'
            # states say why: an interrupted run's are pending, and what finishes it is said.
            run_dir = Path(within.run)
            states = store.states_words(run_dir, (c.status for c in store.read_record(run_dir).cases.values()))
            usage(
                f"{args.runs[0]}: nothing to compare: no two finished cases"
                + (" that --filter/--pair keep" if args.filter or args.pair else "")
                + f" differ in exactly one swept key ({states})",
                "compare",
            )
        return _print_verdict(within, args.format)
    if args.pair or args.filter:
        flags = ", ".join(f for f, v in (("--pair", args.pair), ("--filter", args.filter)) if v)
        usage(f"{flags}: only with a single RUN_DIR (pairs of cases within one run)", "compare")
    comparison = compare.compare_runs(
        args.runs[:-1],
        args.runs[-1:],
        metric=args.metric,
        threshold=threshold,
        fail_on_inconclusive=args.fail_on_inconclusive,
        ignore_env=args.ignore_env,
    )
    return _print_verdict(comparison, args.format)


def cmd_explain(args: argparse.Namespace) -> int:
    from tpbench import explain, render

    report = explain.run(args.runs, pairs=args.pair, ignore_env=args.ignore_env)
    sys.stdout.write(render.EXPLAIN_RENDERERS[args.format](report))
    sys.stdout.flush()
    # Incomparable runs exit as compare's verdict on them does: a script must not read the parts as clean.
    return EXIT_RESULTS if report.environment_differences else EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    from tpbench.compare import GateError
    from tpbench.gate import SideError

    with stop_signals_interrupt():  # SIGTERM/SIGHUP: the sides stopped, their sockets removed, said so
        try:
            return _gate(args)
        except (SideError, GateError) as e:
            if args.format == "md":
                sys.stdout.write(
                    _no_verdict_md(e, "a side failed" if isinstance(e, SideError) else "the gate refused its input")
                )
            raise


def _no_verdict_md(e: Exception, why: str) -> str:
    """What ``--format md`` prints when a side fails or the gate refuses its input (an option, a reused
    ``--out``) and there is no verdict: the CI example tees the Markdown into the job's summary, which
    should not be left empty, the reason only in the job's log."""
    fence = "`" * 3
    text = str(e).replace(fence, "'" * 3)
    return f"**tpbench gate: no verdict**: {why}.\n\n{fence}\n{text}\n{fence}\n"


def _check_lockstep_options(args: argparse.Namespace) -> None:
    """``GateError`` (exit 2, before any sweep) for lockstep options the gate would not honour: a
    ``--target-ci`` whose ``--repeats`` stops short of the pairs a case is decided from, which ran to
    "unknown" without a word; a ``--set``/``--candidate-set`` of a key the gate sets itself, which
    overrode it in each side's sweep (``repeats=2``: 2 repeats run, gate.json saying the gate's own)."""
    from tpbench import compare, gate

    if args.target_ci is not None and args.repeats is not None and args.repeats < gate.MIN_PAIRS:
        raise compare.GateError(
            f"--repeats {args.repeats} with --target-ci: the gate decides a case from {gate.MIN_PAIRS} pairs; "
            f"expected --repeats >= {gate.MIN_PAIRS}"
        )
    for flag, values in (("--set", args.set), ("--candidate-set", args.candidate_set)):
        for value in values or ():
            why = gate.GATE_KEYS.get(value.split("=", 1)[0].strip())
            if why:
                raise compare.GateError(f"{flag} {value}: {why}")


def _gate(args: argparse.Namespace) -> int:
    from tpbench import compare, gate, store

    threshold = compare.parse_threshold(args.threshold)  # before minutes of sweeps, not after
    lockstep_only = {
        "--repeats": args.repeats,
        "--target-ci": args.target_ci,
        "--seed": args.seed,
        "--budget-s": args.budget_s,
    }
    misplaced = given_flags(lockstep_only) if args.mode == "rounds" else []
    if args.mode == "lockstep" and args.rounds is not None:
        misplaced = ["--rounds"]
    if misplaced:
        raise compare.GateError(f"{', '.join(misplaced)}: not an option of --mode {args.mode}")
    if args.mode == "lockstep":
        _check_lockstep_options(args)
    given = {
        k: v for k, v in (("repeats", args.repeats), ("budget_s", args.budget_s), ("seed", args.seed)) if v is not None
    }
    if args.target_ci is not None:
        given = {"repeats": gate.ADAPTIVE_REPEATS} | given | {"target_ci": args.target_ci}
    cfg = gate.Lockstep(metric=args.metric, **given)
    judged = gate.run(
        args.suite,
        args.baseline,
        args.candidate,
        (args.out or Path("results") / "gate" / store.new_run_id()).absolute(),
        mode=args.mode,
        rounds=5 if args.rounds is None else args.rounds,
        cfg=cfg,
        overrides=args.set,
        filters=args.filter,
        candidate_overrides=args.candidate_set,
        announce=lambda line: console.print(line, soft_wrap=True, markup=False),
        threshold=threshold,
        fail_on_inconclusive=args.fail_on_inconclusive,
        ignore_env=args.ignore_env,
        explain_steps=gate.EXPLAIN_STEPS if args.explain else 0,
    )
    if judged.comparison.answer is not None:
        console.print(judged.comparison.answer.line, soft_wrap=True, markup=False)
    console.print(f"Gate runs: {judged.out}", soft_wrap=True, markup=False)
    return _print_verdict(judged.comparison, args.format, "gate")
