"""One line a user can act on for a failed write: disk full, read-only, no permission.

Python's OSError carries errno and the file name; other writers do not: safetensors raises
`SafetensorError('... No space left on device (os error 28)')` (a plain Exception, no path),
torch's C++ writer `RuntimeError: [enforce fail at inline_container.cc:...] unexpected pos`
or `PytorchStreamWriter failed writing file ...` (no reason either). For those the reason is
read from the text where it is there, else the folder being written is probed: a small write
that fails with ENOSPC (or no free blocks) is reported as "No space left on device: <folder>".
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from pathlib import Path

_MESSAGES = {
    errno.ENOSPC: "No space left on device",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EROFS: "Read-only file system",
    errno.EACCES: "Permission denied",
    errno.EPERM: "Operation not permitted",
    # A path through a file (`--out some_file/...`, or a folder the write needs is a file).
    errno.ENOTDIR: "Not a directory (a file stands where a folder must be)",
}
# The OS's words (and Rust's `os error N`) inside other libraries' messages.
_TEXT = {errno.ENOSPC: ("No space left on device", "os error 28"),
         errno.EDQUOT: ("Disk quota exceeded", "os error 122"),
         errno.EROFS: ("Read-only file system", "os error 30")}
# What torch's zip writer says when a write fails (no errno survives the C++ layer).
_TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter failed", "file write failed")
PROBE_BYTES = 1 << 16


def _probe_full(folder: Path) -> bool:
    """Whether `folder`'s filesystem refuses a small write for lack of space."""
    folder = next((p for p in (folder, *folder.parents) if p.is_dir()), Path("."))
    try:
        stat = os.statvfs(folder)
        if stat.f_bavail * stat.f_frsize < PROBE_BYTES:
            return True
        with tempfile.TemporaryFile(dir=folder) as fh:
            fh.write(b"\0" * PROBE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return False


def describe_write_failure(exc: BaseException, where: str | os.PathLike) -> str | None:
    """`<reason>: <path>` for a write failure (None when `exc` is not one)."""
    where = Path(where)
    if isinstance(exc, OSError) and exc.errno in _MESSAGES:
        return f"{_MESSAGES[exc.errno]}: {exc.filename or where}"
    if isinstance(exc, OSError):
        return None
    for code, words in _TEXT.items():
        if any(w in str(exc) for w in words):
            return f"{_MESSAGES[code]}: {where}"
    if any(s in str(exc) for s in _TORCH_WRITE_FAILURES):
        if _probe_full(where):
            return f"{_MESSAGES[errno.ENOSPC]}: {where}"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # A short write on a local disk is almost always a full disk or quota.
        return f"writing under {where} failed (a short write: is the disk full or over quota?): {first}"
    return None


def print_write_failure(prog: str, exc: BaseException, where: str | os.PathLike, *,
                        suffix: str = "", status: int = 2) -> int:
    """Print `<prog>: error: <reason>: <path><suffix>` on stderr for a write failure and return the
    exit status `status` (a command's `main` returns it); re-raise `exc` when it is no write failure.

    Why re-raise: an error describe_write_failure does not know is a bug or an input error a
    caller must name itself, and its traceback is the only account of it.
    """
    message = describe_write_failure(exc, where)
    if message is None:
        raise exc
    print(f"{prog}: error: {message}{suffix}", file=sys.stderr)
    return status


def not_a_folder(out: str | os.PathLike, flag: str) -> str | None:
    """`<flag> <out> is a file, not a folder` when `out`, or the nearest of its parents that exists,
    is no folder (None otherwise): a command that writes a folder there fails only at its first
    or final write, with mkdir's or rename's traceback."""
    out = Path(out)
    for path in (out, *out.parents):
        if path.exists() or path.is_symlink():
            if path.is_dir():
                return None
            where = "is a file" if path == out else f"lies under {path}, a file"
            return f"{flag} {out} {where}, not a folder; give a folder's path"
    return None
