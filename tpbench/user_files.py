"""The files a user hands tpbench, read and written as a careful tool would.

Inputs (suites, fabrics files) are read only when they are regular files, and only up to a size
no real one comes near, so ``/dev/zero`` or a FIFO behind a suite path is refused in one line
instead of filling memory or blocking forever. Outputs the user names (``report -o``,
``export -o``) are written through a symlink to its target and in place into a special file that
already exists (``/dev/null``, a FIFO a reader holds), so that a device node is never replaced by a
regular file, which as root would break the system's own.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# A suite or fabrics file is a few KiB; a megabyte is far past any real one.
MAX_INPUT_BYTES = 1 << 20


def read_text(path: str | Path, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``; ``ValueError`` naming it (and ``what`` it was
    read as) when it is missing, not a regular file, over ``limit`` bytes or not UTF-8."""
    p = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer before we can see it is one.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ValueError(f"{p}: no such {what}") from None
    except OSError as e:
        raise ValueError(f"{p}: cannot read the {what}: {e.strerror or e}") from None
    st = os.fstat(fd)  # before fdopen, which refuses a directory with its own error, naming no path
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(f"{p}: the {what} is not a regular file ({file_kind(st.st_mode)})")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        expected = "; expected a small TOML file" if p.suffix == ".toml" else ""
        raise ValueError(f"{p}: the {what} is larger than {limit // 1024} KiB{expected}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: the {what} is not UTF-8 text (byte {e.start})") from None


def output_target(path: str | Path) -> tuple[Path, bool]:
    """Where writing the user's ``path`` lands, and whether it is written in place: a symlink is
    followed to its target (the link stays), an existing special file is written in place."""
    p = Path(path)
    target = p.resolve() if p.is_symlink() else p
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target, False
    except OSError:
        return target, False
    return target, not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def write_in_place(path: Path, data: bytes) -> None:
    """Write ``data`` into the existing special file ``path`` (no create, no rename); a FIFO
    without a reader fails at once (ENXIO) instead of blocking."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words, for a message that refuses it."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"
