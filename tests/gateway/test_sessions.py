"""Dashboard sessions: a link works once and not after its expiry, a malformed setting is no
link, and a session cookie reads (GET) but never writes."""

from __future__ import annotations

from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.sessions import COOKIE, Sessions, new_link
from gateway.settings import GatewaySettings


def test_a_link_works_once_and_not_after_it_expires() -> None:
    token, setting = new_link("acme")
    sessions = Sessions(setting)
    assert sessions.exchange("wrong") is None
    session = sessions.exchange(token)
    assert session and sessions.tenant(session) == "acme"
    assert sessions.exchange(token) is None  # once
    sessions.end(session)
    assert sessions.tenant(session) is None
    old_token, old = new_link("acme", ttl_s=-1)
    assert Sessions(old).exchange(old_token) is None
    for malformed in ("acme", "acme:short:1", f"acme:{'a' * 64}:soon", ""):
        assert Sessions(malformed).exchange(token) is None


def test_a_session_cookie_reads_but_never_writes(tmp_path) -> None:
    token, setting = new_link("acme")
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme", dashboard_link=setting,
                               manager="ipc:///tmp/symbiosis-test-no-manager.sock")
    with TestClient(create_app(settings)) as client:
        signed = client.post("/dashboard/api/signin", json={"link": token})
        assert signed.status_code == 200 and COOKIE in signed.cookies
        assert "httponly" in signed.headers["set-cookie"].lower()
        assert client.get("/v1/models").status_code == 200  # the cookie reads
        upload = client.post("/v1/files", data={"purpose": "fine-tune"},
                             files={"file": ("a.jsonl", b"{}")})
        assert upload.status_code == 401  # and never writes
        again = client.post("/dashboard/api/signin", json={"link": token})
        assert again.status_code == 401
        assert again.json()["error"]["code"] == "invalid_sign_in_link"
        client.post("/dashboard/api/signout")
        assert client.get("/v1/models").status_code == 401
