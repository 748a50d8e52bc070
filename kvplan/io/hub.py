"""Hub ids (``org/name``) not bundled with kvplan: their config.json from the local Hugging Face cache, or
fetched from the Hub when asked (``--fetch``, or ``KVPLAN_FETCH=1``).

Only ``config.json`` is ever read or downloaded: one ``huggingface_hub.hf_hub_download`` of that file into
the standard cache, so ``transformers``, vLLM and ``hf`` find it there too. The usual variables apply:
``HF_ENDPOINT`` (where the Hub is), ``HF_HOME`` / ``HF_HUB_CACHE`` (where the cache is), ``HF_TOKEN`` (gated
and private repos), ``HF_HUB_OFFLINE`` (never touch the network). They are read when a model is resolved,
not when huggingface_hub is imported, and passed to it explicitly.

No remote code, ever: kvplan reads the config's keys and nothing else; a repo's modeling files (a
config's ``auto_map``) are neither downloaded nor run.

huggingface_hub is imported here only, and only when a hub id is not bundled, so ``kvplan size
llama2-7b`` does not pay for it. Every failure of the Hub (offline, unreachable, 401/403 gated or private,
404 repo, revision or file) becomes one ``HubError`` line saying what to do.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError, HubError, InputError
from kvplan.io.paths import probe, user_path

CONFIG = "config.json"
FETCH_ENV = "KVPLAN_FETCH"
DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub constants._HF_DEFAULT_ENDPOINT
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
# org/name as the Hub spells them (huggingface_hub utils/_validators.py: letters, digits, - _ . ; no "--"
# or ".." and at most 96 characters); anything else is not looked up as a hub id at all.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_REVISION = re.compile(r"^[\w.-]+(/[\w.-]+)*$")  # branch, tag, commit hash, or refs/pr/N


@dataclass(frozen=True, kw_only=True)
class HubConfig:
    """A hub id's config.json in the local Hugging Face cache, and how it got there."""

    repo_id: str
    revision: str  # as asked: a branch, tag or commit (default main)
    commit: str  # the snapshot holding the file (snapshots/<commit>/config.json)
    path: Path
    size_bytes: int
    fetched: bool  # the Hub answered in this run (the file was downloaded or found current)
    downloaded: bool  # its bytes came over the network in this run
    endpoint: str | None  # where it was fetched from; None for a cache read
    note: str = ""  # how it was found, when that is worth saying (a cache read, an offline fallback)

    def as_dict(self) -> dict[str, Any]:
        """The ``fetched`` object of ``--json`` output."""
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit, "path": str(self.path),
                "size_bytes": self.size_bytes, "downloaded": self.downloaded, "endpoint": self.endpoint}

    def describe(self) -> str:
        """One line for stderr: what was fetched, from where, into which file."""
        what = f"{self.repo_id} {CONFIG} (revision {self.revision}, commit {self.commit[:12]}, {self.size_bytes:,} B)"
        if self.downloaded:
            return f"fetched {what} from {self.endpoint} into {self.path}"
        return f"checked {what} with {self.endpoint}: the cached copy is current: {self.path}"


def looks_like_hub_id(ref: str) -> bool:
    """``org/name`` (not a path): the only references kvplan looks for in the Hub or its cache."""
    return bool(_HUB_ID.match(ref)) and ".." not in ref and "--" not in ref


def fetch_enabled(flag: bool | None) -> bool:
    """``--fetch`` / ``--no-fetch`` when given, else ``KVPLAN_FETCH`` (default off: no network)."""
    if flag is not None:
        return flag
    value = os.environ.get(FETCH_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InputError(f"{FETCH_ENV} must be 1 or 0 (true/false, yes/no, on/off) (got {os.environ[FETCH_ENV]!r})")


def check_revision(revision: str | None) -> str | None:
    if revision is not None and (not _REVISION.match(revision) or ".." in revision):
        raise InputError(f"--revision {revision!r} is not a branch, tag or commit hash (e.g. main, v1.0, or 40 hex "
                         "digits)")
    return revision


def hub_cache_dir() -> Path:
    """The cache huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
    (XDG_CACHE_HOME honoured), as huggingface_hub constants.py resolves it (read now, not at import)."""
    env = os.environ
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")  # the second: the legacy name
    if explicit:
        return _expanded(explicit, "HF_HUB_CACHE")
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return _expanded(home, "HF_HOME") / "hub"


def _expanded(value: str, variable: str) -> Path:
    """``$VARS`` and ``~`` expanded; a ``~user`` with no home is a HubError naming the variable."""
    try:
        return user_path(os.path.expandvars(value))
    except ConfigError as exc:
        raise HubError(f"the Hugging Face cache folder ({variable}): {exc}") from None


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _token() -> str | None:
    """HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN); None lets huggingface_hub use a stored login."""
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


def _hub() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.utils  # both: lazy attributes of the package until imported
    except ImportError:  # a dependency of kvplan; missing only in a broken environment
        raise HubError("reading hub ids needs huggingface_hub, which is missing: pip install 'huggingface_hub>=1.0,<3'"
                       ) from None
    return huggingface_hub


@contextmanager
def _quiet(hh: Any) -> Iterator[None]:
    """Only config.json is requested, and kvplan alone says what it fetched: while kvplan's requests run,
    huggingface_hub's telemetry is off (2.x builds its user agent with an "agent harness" registry fetched
    from ``{HF_ENDPOINT}/api/agent-harnesses``, utils/_headers.py::_http_user_agent, unless
    HF_HUB_DISABLE_TELEMETRY), and so are its progress bar and retry warnings."""
    import logging

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    bars_were_off = hh.utils.are_progress_bars_disabled()
    telemetry_was_off = getattr(hh.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    logger.setLevel(logging.ERROR)
    hh.utils.disable_progress_bars()
    hh.constants.HF_HUB_DISABLE_TELEMETRY = True
    try:
        yield
    finally:
        hh.constants.HF_HUB_DISABLE_TELEMETRY = telemetry_was_off
        logger.setLevel(level)
        if not bars_were_off:
            hh.utils.enable_progress_bars()


def cached_config(repo_id: str, revision: str | None = None) -> HubConfig | None:
    """``repo_id``'s config.json at ``revision`` (default main) in the local cache, without the network.

    With no revision asked and no ``refs/main`` (a snapshot downloaded by commit hash, or a copied
    cache), the newest snapshot holding a config.json is used, and the note says which.
    """
    cache = hub_cache_dir()
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    found_folder = probe(folder)  # a cache kvplan may not enter is a ConfigError naming it
    if found_folder is None or not stat.S_ISDIR(found_folder.st_mode):  # the common case: no huggingface_hub import
        return None
    hh = _hub()
    try:
        found = hh.try_to_load_from_cache(repo_id, CONFIG, cache_dir=str(cache), revision=revision or "main")
    except ValueError:  # huggingface_hub's HFValidationError: not a repo id it accepts
        return None
    note = ""
    if isinstance(found, str):
        path = Path(found)
    elif revision is None and found is None:
        snapshots = folder / "snapshots"
        candidates = [p / CONFIG for p in snapshots.iterdir() if (p / CONFIG).is_file()] if snapshots.is_dir() else []
        if not candidates:
            return None
        path = max(candidates, key=lambda p: p.stat().st_mtime)
        note = f"the cache has no refs/main for {repo_id}: the newest cached snapshot ({path.parent.name[:12]}) was used"
    else:
        return None  # not cached at that revision, or cached as missing (.no_exist)
    return HubConfig(repo_id=repo_id, revision=revision or "main", commit=path.parent.name, path=path,
                     size_bytes=path.stat().st_size, fetched=False, downloaded=False, endpoint=None, note=note)


def not_cached_hint(repo_id: str, revision: str | None) -> str:
    """What to run when a hub id is neither bundled nor cached."""
    rev = f" --revision {revision}" if revision else ""
    return (f"add --fetch (or set {FETCH_ENV}=1) to download its config.json from the Hub, or run "
            f"`hf download {repo_id} config.json{rev}`, or pass the path of a config.json")


def fetch_config(repo_id: str, revision: str | None = None) -> HubConfig:
    """Download ``repo_id``'s config.json (only that file) into the Hugging Face cache, or find it current.

    A metadata request (HEAD) comes first, without retries, so an unreachable Hub fails at once (huggingface_hub
    2.x's hf_hub_download retries a refused connection for about 25 s before giving up); hf_hub_download then
    stores the file (HEAD and GET, or HEAD alone when the cached copy is current). When the Hub cannot be
    reached and the file is cached, the cached copy is used, and the note says so.
    """
    rev = revision or "main"
    endpoint = hub_endpoint()
    cache = hub_cache_dir()
    if _offline():
        cached = cached_config(repo_id, revision)
        if cached is not None:
            return dataclasses.replace(cached, note=f"HF_HUB_OFFLINE is set: {repo_id} {CONFIG} was read from the "
                                                     f"local Hugging Face cache (commit {cached.commit[:12]}), not "
                                                     "fetched")
        raise HubError(f"cannot fetch {repo_id} {CONFIG}: HF_HUB_OFFLINE is set and it is not in the local Hugging "
                       f"Face cache ({cache}); unset HF_HUB_OFFLINE where {endpoint} can be reached, or pass the "
                       "path of a config.json")
    hh = _hub()
    before = hh.try_to_load_from_cache(repo_id, CONFIG, cache_dir=str(cache), revision=rev) if (
        cache / f"models--{repo_id.replace('/', '--')}").is_dir() else None
    token = _token()
    agent = {"library_name": "kvplan", "library_version": _version()}
    with _quiet(hh):
        try:
            hh.utils.validate_repo_id(repo_id)
            url = hh.hf_hub_url(repo_id, CONFIG, revision=rev, endpoint=endpoint)
            meta = hh.get_hf_file_metadata(url, token=token, endpoint=endpoint, **agent)
            if meta.commit_hash is None or meta.etag is None:
                raise HubError(f"{endpoint} did not answer like the Hugging Face Hub (no X-Repo-Commit or ETag "
                               f"header for {url}); check HF_ENDPOINT")
            found = hh.hf_hub_download(repo_id, CONFIG, revision=rev, cache_dir=str(cache), token=token,
                                       endpoint=endpoint, **agent)
        except HubError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure of the library call is named below
            if _unreachable(exc) or _status(exc) in _HUB_DOWN:
                cached = cached_config(repo_id, revision)
                if cached is not None:
                    return dataclasses.replace(cached, note=(
                        f"could not reach {endpoint} ({_first_line(exc)}): {repo_id} {CONFIG} was read from the "
                        f"local Hugging Face cache (commit {cached.commit[:12]})"))
            raise HubError(_explain(exc, repo_id, rev, endpoint, cache)) from None
    path = Path(found)
    return HubConfig(repo_id=repo_id, revision=rev, commit=path.parent.name, path=path, size_bytes=path.stat().st_size,
                     fetched=True, downloaded=before != str(path), endpoint=endpoint)


def _version() -> str:
    from kvplan import __version__

    return __version__


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


_HUB_DOWN = (429, 500, 502, 503, 504)  # busy or down: huggingface_hub falls back to the cache on these too


def _status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def _unreachable(exc: BaseException) -> bool:
    """A transport failure (refused, DNS, timeout, TLS, proxy), not an answer from the Hub."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError, TimeoutError)):
        return True
    root = type(exc).__module__.split(".")[0]
    return root in ("httpx", "httpx2", "httpcore", "requests", "urllib3") and not hasattr(exc, "response")


def _explain(exc: BaseException, repo_id: str, revision: str, endpoint: str, cache: Path) -> str:
    """One line for a failed fetch: what happened, and what to change."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    status = _status(exc)
    server_says = getattr(getattr(exc, "response", None), "headers", {}).get("X-Error-Message") or ""
    if isinstance(exc, HFValidationError):
        return f"{repo_id!r} is not a valid hub id ({_first_line(exc)}); a hub id is org/name"
    if isinstance(exc, GatedRepoError):
        return (f"{repo_id} is gated on {endpoint} (HTTP {status}): accept its terms at {endpoint}/{repo_id} and set "
                "HF_TOKEN to a token of that account (or run `hf auth login`)")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"no model repository {repo_id} on {endpoint} (HTTP {status}): check the name; a private repo needs "
                "HF_TOKEN set to a token that can read it")
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r} on {endpoint}: give a branch, tag or commit hash of the repo"
    if isinstance(exc, RemoteEntryNotFoundError):
        return (f"{repo_id} has no {CONFIG} at revision {revision} on {endpoint} (not a transformers model?); pass "
                "the path of a config.json")
    if _unreachable(exc):
        return (f"cannot reach {endpoint} to fetch {repo_id} {CONFIG} ({_first_line(exc)}) and it is not in the "
                f"local Hugging Face cache ({cache}); check the network or HF_ENDPOINT, or pass the path of a "
                "config.json")
    if isinstance(exc, HfHubHTTPError) and status == 401:
        return (f"{endpoint} refused the token (HTTP 401{': ' + server_says if server_says else ''}): set HF_TOKEN to "
                "a valid token, or unset it for a public repo")
    if isinstance(exc, HfHubHTTPError) and status is not None:
        return (f"{endpoint} answered HTTP {status} for {repo_id} {CONFIG}"
                f"{' (' + server_says + ')' if server_says else ''}; try again later, or pass the path of a "
                "config.json")
    if isinstance(exc, OSError):  # the cache cannot be written: permissions, a full disk
        return f"cannot store {repo_id} {CONFIG} in the Hugging Face cache {cache}: {_first_line(exc)}"
    return f"fetching {repo_id} {CONFIG} from {endpoint} failed: {type(exc).__name__}: {_first_line(exc)}"
