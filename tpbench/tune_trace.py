"""``tpbench tune --trace``: after the race, where the recommended setting's time goes.

A tune traces nothing: its timed steps decide, and a trace after every arm's repeats would cost
each arm a world's time. So the answer's last part, "here is where the time goes", is a sweep of
its own, run once the race has ended: the recommended setting and its closest rival (``tune``'s
``traced_arms``), each as the tune ran it (its ``--set`` included: the cases are read back from the
tune's run), one repeat each and ``tune_answer.TRACE_STEPS`` traced steps, into a run beside the tune's.

Each setting's traced steps are split into the parts ``tpbench explain`` uses (compute, exposed
communication, optimizer, idle, straggler wait; ``analysis/explain.py``) and scaled to the step
time the race measured (``_race_step_ms``): the trace gives the composition, the race gives the
time, as ``explain`` scales traced parts to timed medians. The rival's change against the
recommended setting is then given part by part (``_by_part``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpbench import store, sweep, tune_answer
from tpbench.analysis import explain as parts
from tpbench.analysis.stats import averaging_window, geometric_mean, repeat_values, windows_of
from tpbench.explain import traced_steps
from tpbench.record import Case
from tpbench.suite import SuiteError, parse
from tpbench.tune_record import TuneArm, TuneResult
from tpbench.verdict import signed_ms
from tpbench.worlds import Torchrun

RECOMMENDED, RIVAL = "recommended", "closest rival"


@dataclass(frozen=True)
class TracedArm:
    case_id: str
    label: str
    role: str  # RECOMMENDED or RIVAL
    step_ms: float  # the race's step time for it (``_race_step_ms``)
    traced_steps: int
    parts_ms: dict[str, float]  # ``parts.PARTS`` per step, scaled to ``step_ms``: they sum to it


@dataclass(frozen=True)
class WhereTime:
    """The trace sweep's run, each setting's parts and, with a rival, its change part by part (``_by_part``)."""

    run_dir: Path
    arms: list[TracedArm]
    sentence: str | None  # the rival against the recommended setting (None: no rival)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "arms": [dataclasses.asdict(a) for a in self.arms],
            "sentence": self.sentence,
        }


class TraceError(RuntimeError):
    """The trace sweep could not run, or did not give both settings' traced steps; the tune's answer stands."""


def prepared(tuned: store.Loaded, case_ids: list[str]) -> sweep.Prepared:
    """The trace sweep: the tune's cases ``case_ids`` as it ran them, with one repeat and
    ``tune_answer.trace_steps`` traced steps in one window; its suite is the tune's (the same file and tables)."""
    record = tuned.record
    source = record.suite
    suite = dataclasses.replace(parse(source.text, source.path or source.name), path=source.path)
    cases = []
    for cid in case_ids:
        params = record.cases[cid].params
        steps = tune_answer.trace_steps([averaging_window(params)])
        cases.append(dataclasses.replace(Case.from_params(params), repeats=1, profiler_steps=steps, trace_windows=1))
    return sweep.Prepared(suite, cases)


def trace(
    result: TuneResult,
    launcher: Torchrun | None | str,
    progress: sweep.Progress,
) -> TuneResult:
    """Sweep the recommended arm and its closest rival with traces beside the tune's run, split their
    steps, and return the result with them (``where``), saved in tune.json for the report; unchanged
    where the tune recommends nothing. Raises ``TraceError`` when the sweep gives no traced steps for
    one of them (a case failed: its reason is in the trace run)."""
    arms = tune_answer.traced_arms(result.arms)
    if not arms:
        return result
    tuned_dir = Path(result.run_dir)
    tuned = store.load(tuned_dir)
    if launcher == sweep.RECORDED:  # a resumed tune: started as the tune was
        launcher = sweep.launcher_of(tuned.record)
    try:
        outcome = sweep.run(
            prepared(tuned, [a.case_id for a in arms]),
            out=tuned_dir.parent.parent,
            launcher=launcher,
            progress=progress,
        )
    except (sweep.SweepError, store.StoreError, SuiteError, OSError) as e:  # the tune's answer is still printed
        raise TraceError(f"the trace sweep could not run: {e}") from e
    run_dir = outcome.run.dir
    step_ms = _race_step_ms(tuned, arms, result.metric)
    traced = []
    for arm, ms in zip(arms, step_ms):
        steps = traced_steps(run_dir, arm.case_id)
        if steps is None or steps.empty:
            status = outcome.run.case_status().get(arm.case_id)
            raise TraceError(f"{run_dir}: no traced steps for {arm.label} (case {arm.case_id}, {status})")
        traced.append(parts.scaled(steps, ms))
    out = [
        TracedArm(
            a.case_id,
            a.label,
            RECOMMENDED if i == 0 else RIVAL,
            float(t["step_ns"].mean()) / 1e6,
            len(t),
            {p: float(t[p].mean()) / 1e6 for p in parts.PARTS},
        )
        for i, (a, t) in enumerate(zip(arms, traced))
    ]
    sentence = _by_part(parts.explain(traced[0], traced[1])) if len(traced) == 2 else None
    result = dataclasses.replace(result, where=WhereTime(run_dir, out, sentence).to_json())
    saved = store.read_tune(tuned_dir)
    if saved is not None:  # the tune's own record, which the trace comes after
        store.write_tune(tuned_dir, dataclasses.replace(saved, result=result))
    return result


def _by_part(e: parts.Explanation) -> str:
    """The rival's step against the recommended one, part by part, largest change first, each with
    its interval, and which intervals exclude no change. Not ``explain``'s sentence ("mostly X:
    692% of the change"): the two settings of a tie differ by little, often in parts that offset
    each other (less exposed communication, more compute), and the parts are the finding."""
    changes = sorted(e.components, key=lambda c: -abs(c.delta_ms))
    listed = ", ".join(
        f"{c.name.replace('_', ' ')} {signed_ms(c.delta_ms)} ms [{signed_ms(c.lo)}, {signed_ms(c.hi)}]"
        for c in changes
        if c.delta_ms
    )
    shown = [c.name.replace("_", " ") for c in changes if c.lo > 0 or c.hi < 0]
    return (
        f"{e.delta_ms:+.2f} ms a step ({e.cand_ms:.2f} against {e.base_ms:.2f} ms); by part, the largest change "
        f"first: {listed} (95% intervals over {e.base_steps} and {e.cand_steps} traced steps; "
        + (f"excluding no change: {', '.join(shown)})." if shown else "none excludes no change).")
    )


def _race_step_ms(tuned: store.Loaded, arms: list[TuneArm], metric: str) -> list[float]:
    """The step times the race measured, to scale the traces to: the recommended arm's geometric
    mean over its rounds (the statistic the race ranks by), and the rival's that times its ratio to
    it (the tune's "vs recommended", paired over the rounds both ran), so that the parts' difference
    is the table's. Raced on CPU time, whose ratio says nothing of wall time: each arm's own mean."""
    windows = windows_of({cid: c.params for cid, c in tuned.record.cases.items()})

    def own(case_id: str) -> float:
        steps = tuned.steps[tuned.steps["case_id"] == case_id]
        return geometric_mean(repeat_values(steps, "step_ms", windows)["step_ms"])

    base = own(arms[0].case_id)
    return [base] + [
        base * a.ratio if metric == "step_ms" and a.ratio is not None else own(a.case_id) for a in arms[1:]
    ]
