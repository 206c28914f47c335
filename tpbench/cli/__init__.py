"""The ``tpbench`` command: argument parsing and terminal output only; the work is in the library.

One module per command or family of commands (``sweep``, ``tune``, ``verdicts``: compare, gate and
explain; ``show``: report, export, whatif, validate, env, list), their options in ``options``,
and what they share (consoles, exit codes, stop signals) in ``common``, whose docstring lists the
exit codes.
"""

from __future__ import annotations

import sys

from tpbench.cli.common import EXIT_RESULTS, EXIT_USAGE, console, error, interrupted
from tpbench.cli.options import build_parser


def main(argv: list[str] | None = None) -> None:
    from tpbench.compare import GateError
    from tpbench.explain import ExplainError, NoTraces
    from tpbench.gate import SideError
    from tpbench.interconnect import InterconnectUnavailable
    from tpbench.racing import TuneError
    from tpbench.store import StoreError
    from tpbench.suite import SuiteError

    args = build_parser().parse_args(argv)
    if args.command in ("sweep", "tune") and not args.suite and not args.resume:
        console.print(f"tpbench {args.command}: error: give a SUITE file, or --resume RUN_DIR", markup=False)
        sys.exit(EXIT_USAGE)
    try:
        code = args.func(args)
    except (SuiteError, InterconnectUnavailable) as e:
        error(e)
        code = EXIT_USAGE
    except (StoreError, NoTraces) as e:
        error(e)
        code = EXIT_RESULTS
    except OSError as e:
        # A disk that fills up or a folder that disappears mid-sweep: what finished is on disk.
        error(RuntimeError(f"{e.filename or ''}: {e.strerror or e}"))
        code = EXIT_RESULTS
    except KeyboardInterrupt as e:
        # Before a run directory exists (or outside a sweep): nothing to resume, nothing to say but that.
        said, code = interrupted(e)
        console.print(said, markup=False)
    except (GateError, TuneError, ExplainError) as e:
        error(e)
        code = EXIT_USAGE
    except SideError as e:
        error(e)
        code = EXIT_USAGE if e.usage else EXIT_RESULTS
    sys.exit(code)
