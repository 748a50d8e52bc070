"""Hub ids through huggingface_hub against a real local HTTP server standing in for the Hub
(tests/hub_server.py): only config.json is asked for, it lands in the standard cache layout, later runs
work offline from it, and every failure is one HubError line."""

from __future__ import annotations

import json

import pytest

from kvplan.core.engines import get_engine
from kvplan.core.sizing import size_kv
from kvplan.errors import ConfigError, HubError, InputError
from kvplan.io.models import resolve_model
from tests.hub_server import GOOD_TOKEN, TINY_LLAMA, TINY_LLAMA_BYTES_PER_TOKEN, git_blob_sha1, serve_hub


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running stand-in for the Hub (HF_ENDPOINT) and an empty HF_HOME."""
    yield from serve_hub(tmp_path, monkeypatch)


CONFIG_PATH = "/acme/tiny/resolve/main/config.json"


def _repo_dir(tmp_path, repo="acme/tiny"):
    return tmp_path / "hf-home" / "hub" / f"models--{repo.replace('/', '--')}"


def test_fetch_asks_for_config_json_only_and_stores_it_in_the_hf_cache_layout(hub, tmp_path):
    r = resolve_model("acme/tiny", fetch=True)
    repo = hub.repos["acme/tiny"]
    data = repo.files["config.json"]
    assert {(q.method, q.path) for q in hub.log} == {("HEAD", CONFIG_PATH), ("GET", CONFIG_PATH)}
    assert [q.method for q in hub.log].count("GET") == 1
    folder = _repo_dir(tmp_path)
    assert r.hub is not None and r.hub.fetched and r.hub.downloaded
    assert r.hub.commit == repo.commit and r.hub.revision == "main" and r.hub.size_bytes == len(data)
    assert r.hub.path == folder / "snapshots" / repo.commit / "config.json"
    assert (folder / "refs" / "main").read_text() == repo.commit
    assert (folder / "blobs" / git_blob_sha1(data)).read_bytes() == data  # the blob is named by its ETag
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == [f"blobs/{git_blob_sha1(data)}", "refs/main", f"snapshots/{repo.commit}/config.json"]
    assert r.hub.endpoint == hub.url
    assert r.spec.name == "acme/tiny" and r.spec.num_layers == TINY_LLAMA["num_hidden_layers"]
    assert size_kv(r.spec, get_engine("ideal"), batch=1, seq_len=1).bytes_per_token == TINY_LLAMA_BYTES_PER_TOKEN


def test_a_current_cached_copy_is_checked_with_head_and_not_downloaded_again(hub):
    resolve_model("acme/tiny", fetch=True)
    first = len(hub.log)
    r = resolve_model("acme/tiny", fetch=True)
    assert r.hub is not None and r.hub.fetched and not r.hub.downloaded
    assert {q.method for q in hub.log[first:]} == {"HEAD"}


def test_the_second_run_works_offline_from_the_cache(hub, monkeypatch):
    fetched = resolve_model("acme/tiny", fetch=True)
    hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached = resolve_model("acme/tiny")
    assert cached.hub is not None and not cached.hub.fetched and cached.hub.path == fetched.hub.path
    assert cached.spec.layers == fetched.spec.layers
    assert any("read from the local Hugging Face cache" in n for n in cached.spec.notes)
    asked = resolve_model("acme/tiny", fetch=True)  # --fetch while offline: the cache, and a note saying so
    assert not asked.hub.fetched and any("HF_HUB_OFFLINE is set" in n for n in asked.spec.notes)


def test_an_unreachable_hub_falls_back_to_the_cached_copy(hub):
    resolve_model("acme/tiny", fetch=True)
    hub.stop()
    r = resolve_model("acme/tiny", fetch=True)
    assert not r.hub.fetched and any(n.startswith(f"could not reach {hub.url}") for n in r.spec.notes)


def test_without_fetch_nothing_is_requested_and_the_error_says_how_to_get_it(hub):
    with pytest.raises(InputError) as err:
        resolve_model("acme/tiny")
    message = str(err.value)
    assert hub.log == []
    assert "\n" not in message and "unknown model 'acme/tiny'" in message
    for how in ("--fetch", "KVPLAN_FETCH=1", "`hf download acme/tiny config.json`", "path of a config.json"):
        assert how in message


def test_kvplan_fetch_turns_fetching_on_and_no_fetch_overrides_it(hub, monkeypatch):
    monkeypatch.setenv("KVPLAN_FETCH", "1")
    with pytest.raises(InputError, match="--fetch"):
        resolve_model("acme/tiny", fetch=False)
    assert hub.log == []
    assert resolve_model("acme/tiny").hub.downloaded
    monkeypatch.setenv("KVPLAN_FETCH", "maybe")
    with pytest.raises(InputError, match="KVPLAN_FETCH must be 1 or 0"):
        resolve_model("acme/other")


@pytest.mark.parametrize("case,match", [
    ("gated", "acme/gated is gated on .*HTTP 401.*HF_TOKEN"),
    ("missing-repo-401", "no model repository acme/nope on .*HTTP 401"),
    ("missing-repo-404", "no model repository acme/nope on .*HTTP 404"),
    ("missing-file", "acme/weights-only has no config.json at revision main"),
    ("missing-revision", "acme/tiny has no revision 'v9'"),
    ("unreachable", "cannot reach .* to fetch acme/tiny config.json .*Connection refused"),
    ("offline", "cannot fetch acme/tiny config.json: HF_HUB_OFFLINE is set"),
    ("not-a-hub", "did not answer like the Hugging Face Hub .*check HF_ENDPOINT"),
    ("bad-token", "refused the token \\(HTTP 401: Invalid credentials in Authorization header\\): set HF_TOKEN"),
])
def test_every_failure_is_one_line(hub, monkeypatch, case, match):
    hub.add("acme/gated", TINY_LLAMA, gated=True)
    hub.add("acme/weights-only", None, extra={"model.safetensors": b"\0"})
    ref, revision = {"gated": "acme/gated", "missing-file": "acme/weights-only",
                     "missing-revision": "acme/tiny"}.get(case, "acme/nope"), None
    if case == "missing-revision":
        revision = "v9"
    if case == "missing-repo-404":
        hub.missing_repo_status = 404
    if case == "bad-token":
        monkeypatch.setenv("HF_TOKEN", "hf_expired")
    if case in ("unreachable", "offline", "not-a-hub", "bad-token"):
        ref = "acme/tiny"
    if case == "unreachable":
        hub.stop()
    if case == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if case == "not-a-hub":
        hub.hub_headers = False
    with pytest.raises(HubError, match=match) as err:
        resolve_model(ref, fetch=True, revision=revision)
    assert "\n" not in str(err.value)
    if case == "offline":
        assert hub.log == []


def test_a_gated_repo_is_fetched_with_hf_token(hub, monkeypatch):
    hub.add("acme/gated", TINY_LLAMA, gated=True)
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    r = resolve_model("acme/gated", fetch=True)
    assert r.hub.downloaded
    assert {q.authorization for q in hub.log} == {f"Bearer {GOOD_TOKEN}"}


def test_a_revision_is_fetched_and_cached_beside_main(hub, tmp_path):
    repo = hub.repos["acme/tiny"]
    repo.branches["v2"] = ("b" * 40, {"config.json": json.dumps({**TINY_LLAMA, "num_hidden_layers": 6}).encode()})
    v2 = resolve_model("acme/tiny", fetch=True, revision="v2")
    main = resolve_model("acme/tiny", fetch=True)
    assert (v2.spec.num_layers, main.spec.num_layers) == (6, 3)
    assert v2.hub.commit == "b" * 40 and (_repo_dir(tmp_path) / "refs" / "v2").read_text() == "b" * 40
    assert {q.path for q in hub.log} == {CONFIG_PATH, "/acme/tiny/resolve/v2/config.json"}
    by_commit = resolve_model("acme/tiny", revision="b" * 40)  # cached under its commit: no request
    assert by_commit.spec.num_layers == 6 and not by_commit.hub.fetched
    with pytest.raises(InputError, match="at revision v3 is not in the local Hugging Face cache"):
        resolve_model("acme/tiny", revision="v3")
    with pytest.raises(InputError, match="is not a branch, tag or commit"):
        resolve_model("acme/tiny", revision="../../etc")
    with pytest.raises(InputError, match="applies to hub ids"):
        resolve_model("llama2-7b", revision="main")


def test_a_bundled_alias_is_not_fetched_unless_a_revision_is_named(hub):
    hub.add("meta-llama/Llama-2-7b-hf", {**TINY_LLAMA, "num_hidden_layers": 5})
    bundled = resolve_model("meta-llama/Llama-2-7b-hf", fetch=True)
    assert bundled.hub is None and bundled.spec.num_layers == 32 and hub.log == []
    assert any(n.startswith("nothing fetched") for n in bundled.spec.notes)
    from_hub = resolve_model("meta-llama/Llama-2-7b-hf", fetch=True, revision="main")
    assert from_hub.spec.num_layers == 5 and from_hub.hub.downloaded


def test_auto_map_code_is_never_fetched_and_a_note_says_so(hub):
    config = {**TINY_LLAMA, "model_type": "tiny_custom",
              "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"}}
    hub.add("acme/custom", config, extra={"modeling_tiny.py": b"raise SystemExit", "configuration_tiny.py": b""})
    r = resolve_model("acme/custom", fetch=True)
    assert {q.path for q in hub.log} == {"/acme/custom/resolve/main/config.json"}
    assert any("auto_map: AutoConfig, AutoModel" in n and "never downloads or runs" in n for n in r.spec.notes)
    assert size_kv(r.spec, get_engine("ideal"), batch=1, seq_len=1).bytes_per_token == TINY_LLAMA_BYTES_PER_TOKEN


def test_a_config_kvplan_cannot_read_gets_the_generic_readers_error(hub):
    hub.add("acme/speech", {"model_type": "brand_new_speech", "d_model": 512, "encoder_layers": 4})
    with pytest.raises(ConfigError, match="required key num_hidden_layers .* is missing") as err:
        resolve_model("acme/speech", fetch=True)
    assert "config.json" in str(err.value) and "\n" not in str(err.value)
