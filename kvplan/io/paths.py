"""Paths as users type them, and what the operating system says about them, as one-line errors.

A path can be refused before any file is opened: ``~nosuchuser/config.json`` has no home to expand
(``Path.expanduser`` raises RuntimeError), a name over the file system's 255 bytes or a path over
4,096 bytes is ENAMETOOLONG, a folder on the way that kvplan may not enter is EACCES, and a path from
a YAML file may hold a NUL byte (ValueError). ``pathlib``'s ``exists()``/``is_file()`` raise all of
these but "no such file". ``user_path`` and ``probe`` turn each into a ConfigError saying what to
change, so every command that reads a path (model argument, workload, budgets, traces) refuses it in
one line; ``open_regular`` (kvplan.io.yamlio) words its own refusals with ``os_error``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from kvplan.errors import ConfigError

# Linux's NAME_MAX and PATH_MAX (limits.h), used when the system cannot be asked (os.pathconf).
_NAME_MAX = 255
_PATH_MAX = 4096
_SHOWN_CHARS = 120  # a path longer than this is shown as its start and end


def shown(path: str | os.PathLike[str]) -> str:
    """The path for a message: whole when short, else its first and last characters around ``...``."""
    text = os.fspath(path)
    if len(text) <= _SHOWN_CHARS:
        return text
    half = (_SHOWN_CHARS - 3) // 2
    return f"{text[:half]}...{text[-half:]} ({len(text):,} characters)"


def user_path(ref: str | os.PathLike[str]) -> Path:
    """``ref`` as a Path with ``~`` and ``~user`` expanded; a user without a home is a ConfigError."""
    try:
        return Path(ref).expanduser()
    except RuntimeError:  # Path.expanduser: "Could not determine home directory."
        head = os.fspath(ref).split("/", 1)[0]
        who = f"no user named {head[1:]!r}" if len(head) > 1 else "no home folder ($HOME is unset)"
        raise ConfigError(f"{shown(ref)}: cannot expand {head}: this machine has {who}; write the path out "
                          "(e.g. /home/NAME/...) or relative to this folder") from None


def probe(path: str | os.PathLike[str]) -> os.stat_result | None:
    """``os.stat(path)``, or None when nothing is there (no such file, or a file where a folder should be);
    every other refusal of the operating system is a ConfigError naming the path and what to change."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise os_error(path, exc) from None
    except ValueError:  # os.stat: "embedded null byte"
        raise nul_error(path) from None


def nul_error(path: str | os.PathLike[str]) -> ConfigError:
    return ConfigError(f"{shown(path)!r}: a path cannot hold a NUL byte (\\x00); remove it")


def os_error(path: str | os.PathLike[str], exc: OSError, *, action: str = "read") -> ConfigError:
    """One line for an OSError raised while stat-ing, opening or writing (``action``) ``path``."""
    where = shown(path)
    if exc.errno == errno.ENAMETOOLONG:
        return ConfigError(f"{where}: {_too_long(path)}")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ConfigError(f"{where}: permission denied: kvplan may not {action} this file or enter a folder above "
                           "it; check their permissions (ls -ld)")
    if exc.errno == errno.ELOOP:
        return ConfigError(f"{where}: too many levels of symbolic links (a link that points to itself?); "
                           "give the file's real path")
    return ConfigError(f"{where}: cannot {action} ({exc.strerror or exc})")


def _too_long(path: str | os.PathLike[str]) -> str:
    raw = os.fsencode(path)
    longest = max(len(part) for part in raw.split(b"/"))
    name_max = _limit("PC_NAME_MAX", _NAME_MAX)
    path_max = _limit("PC_PATH_MAX", _PATH_MAX)
    if longest > name_max:
        return (f"a name in this path is {longest:,} bytes, over the file system's {name_max:,}-byte limit "
                "for a file or folder name; shorten it")
    if len(raw) > path_max:
        return (f"the path is {len(raw):,} bytes, over this system's {path_max:,}-byte limit; give a shorter "
                "one (relative to a nearer folder)")
    return "file name too long for this file system; give a shorter path"


def _limit(name: str, default: int) -> int:
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError):
        return default
