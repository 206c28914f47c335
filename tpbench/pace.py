"""When a routine progress line is due in a log: the one rule for the sweep's and the tune's plain
lines (``cli/``) and the lockstep gate's rounds line (``gate.py``), kept below both because the gate
never imports the command line."""

from __future__ import annotations

import time
from typing import Callable


class PlainPace:
    """When a routine progress line is due in a log (away from a terminal: ``cli.common.redraws``).
    A line per finished repeat made zero.toml's log 216 lines of the same sentence, a 300-round
    tune's 300, and a line every 10 rounds a 500-repeat ``gate --target-ci`` dozens: a reader of a
    CI log wants where the work is and when it will end, not each step of it.

    A routine line is due once ``EVERY_S`` have passed since the log's last line and either a tenth
    (``SHARE``) of the planned work was done since, or ``QUIET_S`` passed: whichever of the 30 s and
    the tenth is rarer, so a short sweep says a line at most every 30 s and a long one about ten, but
    never more than 5 minutes of silence, which CI services that kill a job quiet for 10 minutes
    would take for a hang. Where the work planned is not known (``planned`` 0), time alone paces the
    lines: one every 30 s. What the caller says always (a world's start and end, a failure, a trace
    window taken again, a round that decided an arm, a gate's warning) goes through ``said`` and
    restarts the wait. ``clock`` is injectable so that a test can step time without waiting for it."""

    EVERY_S = 30.0
    SHARE = 0.1
    QUIET_S = 300.0

    def __init__(self, planned: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.planned = planned
        self.clock = clock
        self.last_t = clock()
        self.last_done = 0

    def due(self, done: int) -> bool:
        """Whether a routine line with ``done`` units of work finished is due now."""
        quiet = self.clock() - self.last_t
        return quiet >= self.EVERY_S and (done - self.last_done >= self.SHARE * self.planned or quiet >= self.QUIET_S)

    def said(self, done: int) -> None:
        """A line was said with ``done`` units of work finished: the next waits from here."""
        self.last_t, self.last_done = self.clock(), done
