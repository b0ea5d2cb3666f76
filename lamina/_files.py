"""Output files the CLI writes: whole or not at all.

Every ``--out``/``--report`` file is written to a temporary file in the same folder and
renamed over the target (``os.replace``), so a failure midway (a full disk, a name that
cannot be encoded, an interrupt) leaves an existing file as it was and never a half or
empty one. Text is UTF-8; a lone surrogate (a file name that was not UTF-8, decoded with
``surrogateescape``) is written as its ``\\udcXX`` escape, as the terminal shows it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from lamina.pipeline.errors import ConfigError

__all__ = ["encode_text", "write_atomic"]


def encode_text(text: str) -> bytes:
    """``text`` as UTF-8, lone surrogates as ``\\udcXX`` (never an encoding error)."""
    return text.encode("utf-8", errors="backslashreplace")


def _special(path: Path) -> bool:
    """An existing target that is no regular file (``/dev/stdout``, a FIFO): written in
    place, since a rename would replace the device node rather than write to it."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def write_atomic(path: str | Path, data: str | bytes, *, option: str = "--out") -> Path:
    """Write ``data`` to ``path`` atomically; returns the absolute path written.

    A symlink is followed (its target is replaced); an existing file keeps its permission
    bits, a new one gets the umask's. Any OSError is a ConfigError naming ``option``."""
    target = Path(path).resolve()
    body = encode_text(data) if isinstance(data, str) else data
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        if _special(target):
            with target.open("wb") as fh:
                fh.write(body)
            return target
        try:
            mode: int | None = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = None
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
    except OSError as exc:
        raise ConfigError(option, f"cannot write {path}: {exc.strerror or exc}") from None
    return target
