"""A run's what-if, read from the store: the I/O around the pure model of ``tpbench.analysis.whatif``.

It reads each finished case's analysed tables (intervals, overlap, marks) and step rows, resolves
the run's interconnects to their rates, and reads the user's fabric files; ``tpbench whatif`` and
the report's what-if section call it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tpbench import store, user_files
from tpbench.analysis import whatif
from tpbench.analysis.whatif import Fabric, RunWhatIf
from tpbench.interconnect import resolve


def load_fabrics(extra: Iterable[str | Path] = ()) -> dict[str, Fabric]:
    """The built-in fabrics, then each user file's (a user file may redefine a built-in)."""
    fabrics = whatif.parse_fabrics(whatif.FABRICS_TOML, "built-in fabrics")
    for path in extra:
        fabrics |= whatif.parse_fabrics(user_files.read_text(path, "fabrics file"), str(path))
    return fabrics


def run_whatif(loaded: store.Loaded, fabrics: Mapping[str, Fabric], reference: str | None = None) -> RunWhatIf:
    """``whatif.run_whatif`` on a run's finished cases (see there for what is modelled and validated)."""
    done = loaded.cases[loaded.cases["status"] == store.DONE]
    if done.empty:
        raise ValueError(f"{loaded.run_dir}: no finished case")
    profiles = loaded.record.suite_table("interconnects")
    rate = {link: resolve(link, profiles).rate_bits_per_s or math.inf for link in dict.fromkeys(done["interconnect"])}
    steps_by_case = dict(tuple(loaded.steps.groupby("case_id")))

    def model(row: Mapping[str, Any]) -> whatif.CaseModel:
        cid = row["case_id"]
        return whatif.case_model(
            cid,
            row,
            *(store.read_case_table(loaded.run_dir, cid, t) for t in ("intervals", "overlap", "marks")),
            steps_by_case[cid],
        )

    return whatif.run_whatif(done, steps_by_case, rate, model, fabrics, reference)
