"""Atomic file writes: nothing is ever half written.

Every artifact marble produces goes through these helpers: write to a temporary
sibling, fsync, then `os.replace` (atomic on POSIX). Every JSON they write is strict
(`json_text`: NaN and +-inf are null). A crash leaves either the old
file or the new one, never a torn one, which is what makes every step resumable.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import numbers
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator


def fsync_dir(path: Path) -> None:
    """fsync a folder (a rename or a new entry in it outlives a crash); a filesystem that
    cannot fsync folders is no error."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: str | os.PathLike, files: bool = True) -> None:
    """fsync every file (unless files=False) and every folder under `root`, `root` last:
    a later marker or rename then never outlives the data it vouches for."""
    root = Path(root)
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_dir():
            fsync_dir(path)
        elif files and path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(root)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` on success.

    Works for files and for directories (whatever the body creates at the
    temporary path). On an exception the temporary is removed and `path` is
    untouched.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    target = tmp / final.name
    try:
        yield target
        if not target.exists():
            raise FileNotFoundError(f"atomic write of {final}: nothing was written")
        if final.is_dir() and not final.is_symlink():
            # Directories cannot be replaced atomically in one call: move the old one
            # aside first so a crash between the two renames still leaves a copy.
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(target, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if target.is_file():
                with open(target, "rb+") as fh:
                    os.fsync(fh.fileno())
            os.replace(target, final)
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# The temporary `atomic_path` makes: `.<name>.<8 random characters>.tmp`.
_ATOMIC_TMP_RE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def remove_atomic_leftovers(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of atomic writes that a kill -9 interrupted in `folder`
    (not recursive); returns them. Only for a folder that no other process writes now."""
    folder = Path(folder)
    found = [p for p in sorted(folder.iterdir()) if _ATOMIC_TMP_RE.match(p.name)] \
        if folder.is_dir() else []
    for path in found:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return found


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def finite_or_null(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, +inf, -inf; numpy's too) as
    None, through dicts, lists and tuples: what a JSON file of ours holds where a value is
    undefined. Python's json writes them as `NaN`/`Infinity`, which no strict reader takes."""
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    if isinstance(obj, numbers.Real) and not isinstance(obj, numbers.Integral):
        return float(obj) if math.isfinite(obj) else None
    return obj


def json_text(obj: Any, **kwargs) -> str:
    """The one JSON writer of the project: strict (`allow_nan=False`, non-finite -> null)."""
    return json.dumps(finite_or_null(obj), allow_nan=False, **kwargs)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json_text(obj, indent=2, sort_keys=True) + "\n")


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line and fsync it (a crash loses at most the line in flight).

    A torn tail that an earlier crash or full disk left is repaired first (`repair_tail`):
    appended after a fragment, the new line would glue onto it and block every later read.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json_text(record) + "\n").encode("utf-8")
    with open(path, "ab+") as fh:
        repair_tail(fh, path)
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def repair_tail(fh, path: Path) -> None:
    """Make the file open in `fh` (binary, "ab+") end at a line boundary.

    A last line without its newline is a torn append: cut off with a warning naming
    file and line, unless it parses as JSON (the write lost only its newline: kept,
    newline added).
    """
    size = fh.seek(0, os.SEEK_END)
    if size == 0:
        return
    fh.seek(size - 1)
    if fh.read(1) == b"\n":
        return
    fh.seek(0)
    data = fh.read()  # only on the rare torn file
    keep = data.rfind(b"\n") + 1
    fragment = data[keep:]
    try:
        json.loads(fragment.decode("utf-8"))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        lineno = data.count(b"\n", 0, keep) + 1
        warnings.warn(f"{path}:{lineno}: cutting off a torn last line ({len(fragment)} bytes, "
                      "left by a crash or a full disk) before appending")
        fh.truncate(keep)
    else:
        fh.write(b"\n")


def read_jsonl(path: str | os.PathLike, error: type[Exception] = ValueError,
               torn_tail: bool = True) -> list[tuple[int, Any]]:
    """(line number, record) for every non-blank line of a JSONL file.

    For a log written by `append_jsonl` (`torn_tail=True`) a torn *last* line can only
    come from a crash mid-append: it is skipped with a warning. An input file
    (`torn_tail=False`) has no such excuse. Any other bad line raises `error` naming
    file and line, as does a file that is not UTF-8.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0) if torn_tail else -1
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            if lineno == last:
                warnings.warn(f"{path}:{lineno}: ignoring a torn last line ({exc.msg})")
                break
            raise error(f"{path}:{lineno}: invalid JSON line: {exc.msg}") from exc
    return out


def read_json_object(path: str | os.PathLike, what: str = "a JSON object") -> dict | None:
    """A JSON file holding one object; None when the file does not exist; a ValueError naming
    the file when it is not JSON or not an object (the callers' records: provenance, inputs)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected {what}")
    return data


def file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not a file that can be read, in words; None when it is one. `is_file()`
    is False for a symlink loop, a dangling link, a folder and a file the user may not
    read alike, and each was reported as "not found": the cause decides the fix."""
    path = Path(path)
    try:
        with open(path, "rb"):
            return None
    except FileNotFoundError:
        if path.is_symlink():
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        return "not found"
    except IsADirectoryError:
        return "a folder, not a file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop (it points back to itself)"
        return exc.strerror or str(exc)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in `chunk`-byte blocks (the one definition: downloads,
    checkpoint integrity and the dev mirror all pin files with it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()

