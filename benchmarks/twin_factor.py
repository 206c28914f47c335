"""Which host factor should a shaped twin take? (docs/whatif-runs.md)

On a shaped link whose step is mostly communication, the what-if takes the host factor from the
training thread's CPU time where it lies below the forward passes' (``whatif._host_factor``).
This replays, on finished runs of suites/whatif.toml, each algorithm's projection of its
``--target`` case (default loopback) from its ``--twin`` (default the 500 Mbit/s case) with the
twin's factor as fitted and with two others in its place: the forward passes' (timed over traced,
at most 1) and the geometric mean of the two. Per case it prints the three errors against the
target's measured median; last, per choice, the mean and worst |error| and the median error over
every case of every run. Nothing is swept: it reads the runs' stored traces.

Usage: ``python benchmarks/twin_factor.py RUN_DIR [RUN_DIR ...] [--twin LINK] [--target LINK]``.
"""

import argparse
import dataclasses
import math
import sys

import numpy as np

from tpbench import store, whatif_run
from tpbench.analysis import whatif
from tpbench.analysis.whatif import CaseModel


def errors(twin: CaseModel, target: CaseModel) -> dict[str, float]:
    """The twin's projection of the target's link at each factor choice, % off the target's median."""
    fit = twin.fit
    forward = min(1.0, fit.forward_ms[0] / fit.forward_ms[1]) if fit.forward_ms[1] > 0 else fit.factor
    choices = {"as fitted": fit.factor, "forward passes": forward, "geometric mean": math.sqrt(fit.factor * forward)}
    out = {}
    for name, factor in choices.items():
        moved = dataclasses.replace(twin, fit=dataclasses.replace(fit, factor=factor))
        out[name] = 100 * (moved.step_ms(target.host_path) / target.measured_ms - 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--twin", default="tcp-500mbit")
    parser.add_argument("--target", default="loopback")
    args = parser.parse_args()
    seen: list[dict[str, float]] = []
    for run in args.runs:
        try:
            loaded = store.load(run)
        except store.StoreError as e:  # not a run: argparse's one line and exit 2, not a traceback
            parser.error(str(e))
        done = loaded.cases[loaded.cases["status"] == store.DONE]
        model = whatif_run.case_models(loaded, done, whatif_run.link_wires(loaded, done))
        for algorithm, cases in done.groupby("algorithm"):
            by_link = {row["interconnect"]: row for row in cases.to_dict("records")}
            if args.twin not in by_link or args.target not in by_link:
                continue
            try:
                twin, target = model(by_link[args.twin]), model(by_link[args.target])
            except whatif.NotModelled:  # post-local SGD after its switch, a GPU case, traces gone: no model
                print(f"{run} {algorithm}: skipped (twin or target not modelled)")
                continue
            if twin.refused is not None or target.refused is not None:  # its projections are NaN
                print(f"{run} {algorithm}: skipped (twin or target refused)")
                continue
            errs = errors(twin, target)
            seen.append(errs)
            shown = "  ".join(f"{k} {v:+6.1f} %" for k, v in errs.items())
            print(f"{run} {algorithm:32} factor ×{twin.fit.factor:.2f} ({twin.fit.factor_source})  {shown}")
    if not seen:  # silence would read as "no errors": say which links were missing
        print(
            f"no algorithm has a finished, unrefused case on both --twin {args.twin} and --target {args.target}",
            file=sys.stderr,
        )
        sys.exit(1)
    for name in seen[0]:
        e = np.array([s[name] for s in seen])
        print(
            f"{name:15} over {len(e)}: mean |error| {np.mean(abs(e)):.1f} %, worst {np.max(abs(e)):.1f} %, "
            f"median {np.median(e):+.1f} %"
        )


if __name__ == "__main__":
    main()
