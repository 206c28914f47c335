"""How closely does the what-if replay a case's own traced steps? (docs/whatif-runs.md, "The
model's own miss, step by step")

Per finished run (nothing is swept: it reads the stored traces), how many cases the model
replays within 5 % and 10 % of their own traced steps, three ways:

- ``step by step``: each traced step's replay on the case's fitted path against that step's span,
  the median over the steps: ``Fit.miss``, what the refusal and the interval use;
- ``median vs median``: the median replay against the median traced span (the statistic before);
- ``own step's path``: each step replayed on a path fitted to that step's communication alone (each
  collective kind at the rate it ran in that step, as a trace replay that keeps every traced
  duration would), against that step's span, the median over the steps. What it leaves is the
  composition's error: how the replay puts compute, issues and waits together, not what a
  collective costs.

Usage: ``python benchmarks/own_miss.py RUN_DIR [RUN_DIR ...]``.
"""

import argparse

import numpy as np

from tpbench import store, whatif_run
from tpbench.analysis import replay, whatif


def own_step_path_miss(model: whatif.CaseModel, run_dir: str) -> float:
    """The median over traced steps of each step's replay, on the path fitted to its own
    communication, against its span (NaN where no step has both communication and bytes)."""
    intervals = store.read_case_table(run_dir, model.case_id, "intervals")
    overlap = store.read_case_table(run_dir, model.case_id, "overlap")
    misses = []
    for sk in model.skeletons:
        try:
            path = whatif.fit_host_path([sk], overlap, intervals[intervals["step"] == sk.step])
        except ValueError:
            continue
        replayed_s = replay.step_replays_s([sk], path, 1.0, model.interference.replay_factor)[0]
        misses.append(replayed_s / sk.measured_s - 1)
    return float(np.median(misses)) if misses else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    runs = [load_run(parser, run_dir) for run_dir in args.runs]
    print("run | cases | refused | within 5 % (10 %): step by step | median vs median | own step's path")
    for run_dir, loaded in zip(args.runs, runs, strict=True):
        done = loaded.cases[loaded.cases["status"] == store.DONE]
        model_of = whatif_run.case_models(loaded, done, whatif_run.link_wires(loaded, done))
        rows, refused = np.empty((0, 3)), 0
        for row in done.to_dict("records"):
            try:
                model = model_of(row)
            except whatif.NotModelled:  # refused by the what-if too: a GPU or one-rank case, traces gone, ...
                refused += 1
                continue
            fit = model.fit
            miss = (fit.miss, fit.replay_ms / fit.traced_ms - 1, own_step_path_miss(model, run_dir))
            rows = np.vstack([rows, miss])
            refused += model.refused is not None
        counts = [within(np.abs(rows[:, col]) * 100) for col in range(3)]
        print(f"{loaded.record.run_id} | {len(done)} | {refused} | " + " | ".join(counts))


def load_run(parser: argparse.ArgumentParser, run_dir: str) -> store.Loaded:
    """The run at ``run_dir``, or argparse's one line and exit 2 (it was a StoreError traceback)."""
    try:
        return store.load(run_dir)
    except store.StoreError as e:
        parser.error(str(e))


def within(misses_pct: np.ndarray) -> str:
    """ "N (M)": how many misses are within 5 % (within 10 %)."""
    return f"{(misses_pct <= 5).sum()} ({(misses_pct <= 10).sum()})"


if __name__ == "__main__":
    main()
