"""The first-party `social_list` connector (decisions-part2, "Plugin processes and first-party
plugins": `social_list`): a Mastodon-compatible list timeline.

Pull: `GET {instance_url}/api/v1/timelines/list/{list_id}?min_id=<checkpoint>&limit=40` with the
Bearer token; the checkpoint is the newest status id read, and a full page asks for more.
Push: the instance's deliveries arrive relayed (`relay`) or on the declared `receive` route,
signed `x-hub-signature-256: sha256=<hex HMAC-SHA256(signing_secret, raw body)>`; `update`
gives one item, `delete` a withdrawal. Without a signing secret every push is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from contentsvc.outbound_http import verifying_context
from contentsvc_plugins.html_text import html_to_text
from contentsvc_plugins.server import Plugin, PluginError, terminal
from contentsvc_plugins.source_http import network_error, source_error, status_error

FOLDER = Path(__file__).resolve().parent
PAGE_SIZE = 40  # decisions-part2 social_list: limit=40, max_items 40 per page
DEFAULT_TIMEOUT_SECONDS = 20
SIGNATURE_HEADER = "x-hub-signature-256"
USER_AGENT = "contentsvc-social-list/0.1"
DELETED_REVISION = "deleted"


def build() -> Plugin:
    return Plugin(folder=FOLDER, handlers={"connector/fetch": fetch, "connector/check_credential": check_credential,
                                           "connector/receive": receive})


# ---------------------------------------------------------------- the instance


def _config(request: dict) -> dict:
    connector = request.get("connector")
    config = connector.get("config") if isinstance(connector, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("instance_url"), str) \
            or not isinstance(config.get("list_id"), str):
        raise terminal("invalid_request", "connector.config.instance_url and list_id are required", 400)
    return config


def _instance_url(request: dict) -> str:
    url = _config(request)["instance_url"].rstrip("/")
    configuration = request.get("configuration") or {}
    if urlsplit(url).scheme != "https" and not configuration.get("allow_insecure_instance"):
        # decisions-part2 social_list: instance_url is https (plain http only where the operator allows it)
        raise source_error("insecure_instance_url", "the instance address must be https")
    return url


def _token(request: dict) -> str:
    credential = request.get("credential")
    if not isinstance(credential, dict) or not isinstance(credential.get("token"), str):
        raise PluginError(502, "credential_missing", "the connector has no token", error_class="access")
    return credential["token"]


def _get(request: dict, path: str, params: dict[str, str | int]) -> httpx.Response:
    configuration = request.get("configuration") or {}
    url = _instance_url(request) + path
    headers = {"authorization": f"Bearer {_token(request)}", "accept": "application/json",
               "user-agent": USER_AGENT}
    try:
        with httpx.Client(timeout=configuration.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS),
                          follow_redirects=False, trust_env=False, verify=verifying_context()) as client:
            response = client.get(url, params=params, headers=headers)
    except httpx.HTTPError as exc:
        raise network_error(exc, "the instance") from None
    if response.status_code != 200:
        raise status_error(response.status_code, response.headers, "the instance")
    return response


# ---------------------------------------------------------------- items


def status_item(status: object) -> dict | None:
    """decisions-part2 social_list: record_key the status uri, revision edited_at or created_at,
    Part `body` (spoiler_text first, then the HTML content reduced to text). None when the status
    carries no text (a bare boost or media only) or is not a status."""
    if not isinstance(status, dict) or not isinstance(status.get("uri"), str) or not status["uri"]:
        return None
    created = status.get("created_at")
    revision = status.get("edited_at") or created
    if not isinstance(revision, str) or not revision:
        return None
    content = status.get("content") or ""
    reblog = status.get("reblog")
    if not content and isinstance(reblog, dict):  # a boost: its text is the boosted status's
        content = reblog.get("content") or ""
    texts = [text for text in (str(status.get("spoiler_text") or "").strip(), html_to_text(str(content))) if text]
    if not texts:
        return None
    return {"record_key": status["uri"][:1024], "revision": revision[:256],
            "source_position": (created if isinstance(created, str) and created else revision)[:256],
            "content": {"kind": "manifest",
                        "parts": [{"key": "body", "role": "body", "content": {"kind": "text",
                                                                              "text": "\n\n".join(texts)}}]}}


def _newest_id(statuses: list[dict]) -> str | None:
    ids = [str(status["id"]) for status in statuses if isinstance(status, dict) and status.get("id") is not None]
    if not ids:
        return None
    if all(i.isdigit() for i in ids):  # Mastodon ids are numeric strings ordered by time
        return max(ids, key=int)
    return ids[0]  # a timeline lists its newest first


# ---------------------------------------------------------------- contributions


def fetch(request: dict) -> dict:
    config = _config(request)
    checkpoint = request.get("checkpoint") if isinstance(request.get("checkpoint"), dict) else {}
    params: dict[str, str | int] = {"limit": PAGE_SIZE}
    if checkpoint.get("min_id"):
        params["min_id"] = checkpoint["min_id"]
    response = _get(request, f"/api/v1/timelines/list/{config['list_id']}", params)
    try:
        statuses = response.json()
    except ValueError:
        raise source_error("invalid_answer", "the instance did not answer JSON") from None
    if not isinstance(statuses, list):
        raise source_error("invalid_answer", "the instance did not answer a list of statuses")
    items = [item for item in map(status_item, statuses[:PAGE_SIZE]) if item is not None]
    newest = _newest_id(statuses)
    next_checkpoint = {"min_id": newest} if newest is not None else (checkpoint or {"min_id": None})
    return {"items": items, "checkpoint": next_checkpoint,
            "more": len(statuses) >= PAGE_SIZE and newest is not None,  # decisions-part2: more while a page is full
            "reads": 1, "diagnostics": {"statuses": len(statuses), "without_text": len(statuses) - len(items)}}


def check_credential(request: dict) -> dict:
    """The token is good when the instance shows the list with it."""
    _get(request, f"/api/v1/lists/{_config(request)['list_id']}", {})
    return {"status": "ok"}


def receive(request: dict) -> dict:
    """decisions-part2 social_list push: a signed `{event, payload}`; `update` is one item, `delete` a withdrawal."""
    relayed = request.get("request")
    if not isinstance(relayed, dict):
        raise terminal("invalid_request", "request is required", 400)
    if relayed.get("method") != "POST":
        raise PluginError(405, "method_not_allowed", "deliveries are POSTed", headers={"allow": "POST"})
    try:
        raw = base64.b64decode(relayed.get("body_base64") or "", validate=True)
    except ValueError:
        raise terminal("invalid_request", "request.body_base64 is not base64", 400) from None
    credential = request.get("credential") if isinstance(request.get("credential"), dict) else {}
    secret = credential.get("signing_secret")
    if not isinstance(secret, str) or not secret:
        raise PluginError(401, "signing_secret_missing", "no signing secret is deposited: pushes are refused")
    headers = relayed.get("headers") if isinstance(relayed.get("headers"), dict) else {}
    presented = headers.get(SIGNATURE_HEADER)
    expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    if not isinstance(presented, str) or not hmac.compare_digest(presented.strip().lower().encode(),
                                                                  expected.encode()):
        raise PluginError(401, "invalid_signature", f"{SIGNATURE_HEADER} does not sign this body")
    try:
        delivery = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise terminal("malformed_json", "the delivery is not JSON", 400) from None
    if not isinstance(delivery, dict) or delivery.get("event") not in ("update", "delete"):
        raise terminal("invalid_payload", "a delivery is {event: update|delete, payload}")
    payload = delivery.get("payload")
    if delivery["event"] == "update":
        item = status_item(payload)
        items = [item] if item is not None else []
        if item is None and not (isinstance(payload, dict) and isinstance(payload.get("uri"), str)):
            raise terminal("invalid_payload", "an update's payload is a status with a uri")
    else:
        uri = payload.get("uri") if isinstance(payload, dict) else payload
        if not isinstance(uri, str) or not uri:
            raise terminal("invalid_payload", "a delete's payload is the status uri")
        items = [withdrawal(uri[:1024], str(request.get("now") or "deleted"))]
    body = json.dumps({"accepted": len(items)}).encode()
    return {"response": {"status": 200, "headers": {"content-type": "application/json"},
                         "body_base64": base64.b64encode(body).decode()},
            "items": items, "push": {"state": "active"}}


def withdrawal(uri: str, now: str) -> dict:
    """A deleted status: a withdraw item (its content only names the status, as every item carries content)."""
    return {"record_key": uri, "revision": DELETED_REVISION, "source_position": now[:256], "withdraw": True,
            "content": {"kind": "text", "text": uri}}
