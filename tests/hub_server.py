"""A real HTTP server standing in for the Hugging Face Hub, for the `--fetch` tests (no mock objects).

It answers what ``huggingface_hub.hf_hub_download`` asks for one file, with the headers huggingface_hub 2.x
reads (file_download.py::get_hf_file_metadata, utils/_http.py::hf_raise_for_status):

- ``HEAD/GET /{org}/{name}/resolve/{revision}/{file}``: 200 with ``X-Repo-Commit`` (the commit the revision
  points at), ``ETag`` (a file's git blob sha1, quoted, as the Hub sends for files outside LFS) and
  ``Content-Length``; GET adds the body.
- a repo that does not exist: 401 with ``X-Error-Code: RepoNotFound`` (what the Hub answers an anonymous
  caller; ``missing_repo_status`` = 404 gives the answer an authenticated caller gets);
- a gated repo without an accepted token: 401 with ``X-Error-Code: GatedRepo``;
- a token other than ``GOOD_TOKEN``: 401 "Invalid credentials in Authorization header" (no error code);
- an unknown revision: 404 ``RevisionNotFound``; a file not in the repo: 404 ``EntryNotFound`` with the
  ``X-Repo-Commit`` header (huggingface_hub caches the absence under ``.no_exist``).

``hub_headers = False`` answers like a plain web server (no ``X-Repo-Commit``, no ``ETag``). Every request is logged (method, path, Authorization header) so a test can assert what was asked for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

GOOD_TOKEN = "hf_test_token_with_access"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]  # at main
    commit: str
    gated: bool = False
    branches: dict[str, tuple[str, dict[str, bytes]]] = field(default_factory=dict)  # name -> (commit, files)

    def at(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        if revision in ("main", self.commit):
            return self.commit, self.files
        for name, (commit, files) in self.branches.items():
            if revision in (name, commit):
                return commit, files
        return None


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    authorization: str | None


class FakeHub:
    """The server, its repos and its request log; ``url`` goes into HF_ENDPOINT."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.log: list[Request] = []
        self.missing_repo_status = 401
        self.hub_headers = True  # False: answer like a plain web server (no X-Repo-Commit, no ETag)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def add(self, repo_id: str, config: dict[str, Any] | None, *, gated: bool = False,
            commit: str | None = None, extra: dict[str, bytes] | None = None) -> Repo:
        files = dict(extra or {})
        if config is not None:
            files["config.json"] = json.dumps(config, indent=2).encode()
        repo = Repo(files=files, commit=commit or hashlib.sha1(repo_id.encode()).hexdigest(), gated=gated)
        self.repos[repo_id] = repo
        return repo

    def start(self) -> None:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: the log is kept in hub.log
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _send(self, status: int, headers: dict[str, str], payload: bytes, body: bool) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")  # no keep-alive: stop() leaves nothing answering
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _error(self, status: int, code: str, message: str, body: bool, **headers: str) -> None:
                payload = json.dumps({"error": message}).encode()
                codes = {"X-Error-Code": code} if code else {}
                self._send(status, {**codes, "X-Error-Message": message, "Content-Type": "application/json",
                                    **headers}, payload, body)

            def _answer(self, body: bool) -> None:
                auth = self.headers.get("Authorization")
                hub.log.append(Request(self.command, self.path, auth))
                parts = unquote(self.path.split("?", 1)[0]).lstrip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    self._error(404, "NotFound", "not an endpoint of this fake hub", body)
                    return
                repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(hub.missing_repo_status, "RepoNotFound", "Repository not found", body)
                    return
                if auth is not None and auth != f"Bearer {GOOD_TOKEN}":  # the Hub refuses a bad token anywhere
                    self._error(401, "", "Invalid credentials in Authorization header", body)
                    return
                if repo.gated and auth != f"Bearer {GOOD_TOKEN}":
                    self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                "to it and be authenticated to access it. Please log in.", body)
                    return
                found = repo.at(revision)
                if found is None:
                    self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, body)
                    return
                commit, files = found
                if filename not in files:
                    self._error(404, "EntryNotFound", f"{filename} does not exist on \"{revision}\"", body,
                                **{"X-Repo-Commit": commit})
                    return
                data = files[filename]
                ids = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_sha1(data)}"'} if hub.hub_headers else {}
                self._send(200, {**ids, "Content-Type": "application/json"}, data, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"  # kept after stop(): the address then refuses connections
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def paths(self) -> list[str]:
        return [r.path for r in self.log]


TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
              "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 688,
              "vocab_size": 1000, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}
# 2 (K and V) x 3 layers x 2 KV heads x (256 / 8) head_dim x 2 B (bf16), written out from the config above
TINY_LLAMA_BYTES_PER_TOKEN = 2 * 3 * 2 * 32 * 2


def serve_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The body of a test module's ``hub`` fixture: a running fake Hub with ``acme/tiny``; HF_ENDPOINT
    points at it, HF_HOME at an empty tmp dir, and no HF_* or KVPLAN_FETCH setting of the caller leaks in."""
    server = FakeHub()
    server.add("acme/tiny", TINY_LLAMA, extra={"model.safetensors": b"\0" * 64, "modeling_tiny.py": b"raise 1"})
    server.start()
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN",
                "HUGGING_FACE_HUB_TOKEN", "KVPLAN_FETCH", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    yield server
    server.stop()
