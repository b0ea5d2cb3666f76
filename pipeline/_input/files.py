"""Reading input files without trusting the path: open first, then check what was opened.

Every open is non-blocking (a FIFO cannot hang it) and the opened descriptor is checked
with ``fstat`` before any read, so a FIFO, a device or a directory is refused whatever
its name. Inside a vault the path is walked one component at a time from the vault's
directory descriptor with ``O_NOFOLLOW``; a symlink is followed only by substituting its
target into the walk, so a swap of any component between a check and the read can only
make the read fail, never leave the vault.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["FileProblem", "read_confined", "read_regular"]

_MAX_SYMLINKS = 40
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)
_FILE_FLAGS = os.O_RDONLY | _NONBLOCK | _CLOEXEC | _BINARY
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _CLOEXEC


class FileProblem(Exception):
    """Why a file was not read: ``reason`` is missing, directory, not-regular, too-large,
    outside or unreadable; callers turn it into their own typed error."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


def _problem(exc: OSError) -> FileProblem:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return FileProblem("missing", "no such file")
    if exc.errno == errno.EISDIR:
        return FileProblem("directory", "the path is a directory")
    return FileProblem("unreadable", exc.strerror or str(exc))


def _read_fd(fd: int, max_bytes: int) -> bytes:
    """Read an opened descriptor (closed here) if it is a regular file within ``max_bytes``."""
    with os.fdopen(fd, "rb", closefd=True) as handle:
        info = os.fstat(handle.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise FileProblem("directory", "the path is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise FileProblem("not-regular", "not a regular file (a FIFO, socket or device)")
        if info.st_size > max_bytes:
            raise FileProblem("too-large", f"the file is over {max_bytes:,} bytes")
        # Ask for the file's size, not the cap: read(n) allocates n bytes.
        data = handle.read(info.st_size + 1)
        while len(data) <= max_bytes and (more := handle.read(65536)):
            data += more  # the file grew after fstat
    if len(data) > max_bytes:
        raise FileProblem("too-large", f"the file is over {max_bytes:,} bytes")
    return data


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """A regular file's bytes; FIFOs, devices, directories and files over the cap refused."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError as exc:
        raise _problem(exc) from None
    try:
        return _read_fd(fd, max_bytes)
    except OSError as exc:
        raise _problem(exc) from None


def read_confined(root: str | os.PathLike[str], rel: str, max_bytes: int) -> bytes:
    """The bytes of ``rel`` (``/``-separated) below ``root``, never of a file outside it.

    Symlinks inside the vault are followed; one whose target leaves ``root`` is refused
    with reason ``outside``, wherever in the path it is and whenever it appeared.
    """
    try:
        fd = _open_confined(os.fspath(root), rel)
        return _read_fd(fd, max_bytes)
    except OSError as exc:
        raise _problem(exc) from None


def _open_confined(root: str, rel: str) -> int:
    root_fd = os.open(root, _DIR_FLAGS)
    dirs = [root_fd]  # the descriptors of the real folders walked so far
    pending = [p for p in rel.split("/") if p not in ("", ".")]
    hops = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == "..":
                if len(dirs) == 1:
                    raise FileProblem("outside", "path leads outside the vault")
                os.close(dirs.pop())
                continue
            last = not pending
            flags = (_FILE_FLAGS if last else _DIR_FLAGS) | _NOFOLLOW
            try:
                fd = os.open(name, flags, dir_fd=dirs[-1])
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                hops += 1
                if hops > _MAX_SYMLINKS:
                    raise FileProblem("unreadable", "too many levels of symbolic links") from None
                try:
                    target = os.readlink(name, dir_fd=dirs[-1])
                except OSError as again:
                    if again.errno == errno.EINVAL and exc.errno == errno.ELOOP:
                        pending.insert(0, name)  # swapped for a non-link meanwhile: open again
                        continue
                    raise exc from None  # not a symlink: the original error stands
                if os.path.isabs(target):
                    # Map an absolute target to a vault path, then walk it like any other.
                    inside = os.path.relpath(os.path.realpath(target), root)
                    if inside == os.pardir or inside.startswith(os.pardir + os.sep):
                        raise FileProblem(
                            "outside", "path leads outside the vault through a symlink"
                        ) from None
                    while len(dirs) > 1:
                        os.close(dirs.pop())
                    target = inside.replace(os.sep, "/")
                # ".." in the target pops the real folders walked, as the kernel would.
                pending[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if last:
                return fd
            dirs.append(fd)
        raise FileProblem("directory", "the path is a directory")
    finally:
        for fd in dirs:
            os.close(fd)
