"""The `record` of the subscription request the service sends an evaluator (part 2 "Plugin protocol" >
Subscription request; decisions-part2 "Evaluation trigger and eligibility").

Pure: no I/O, no clock, no randomness, so the preview (monitoring/previews.py) and the `monitor`
worker build identical requests for the same Version and evaluations, and tests can check them
without a server. This module builds the `record`; grouping, batching, ids, idempotency keys,
the request around a batch and the checks of the answer are monitoring/batches.py's:

    record = record_object(RecordVersion(...), enriched=..., normalization="builtin")
    for batch in plan_batches(record["record_version_id"], pending, contribution.max_batch_size):
        body = subscription_request(invocation_id, org_id, record, batch, plugin_configuration)
        answer = await client.invoke("subscription", body, timeout)
        decisions = check_answer(answer, batch.ids, part_keys(record))  # InvalidOutput -> evaluator_invalid_output
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


MAX_PARTS = 256  # part 2 Limits: record parts at most 256
BUILTIN_NORMALIZATION = "builtin"  # decisions-part2: `builtin` or the normalizer plugin id


@dataclass(frozen=True)
class RecordVersion:
    """What the request's `record` says of one Version, as the read model holds it (versions and
    records tables). `manifest` is the normalized manifest (`{"parts": [...]}`), `provenance` the
    accepted provenance (`origin`, `producer`, `producer_version`, `connector`)."""

    corpus_id: str
    record_id: str
    record_version_id: str
    namespace: str
    record_key: str
    accepted_at: str  # RFC 3339 UTC
    manifest: dict[str, Any]
    provenance: dict[str, Any]
    extensions: dict[str, Any] | None = None
    position: str | None = None  # the source's position of the item, when the source gave one


def text_parts(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """The Version's text Parts `{key, role, text}` in manifest order, at most 256 (part 2: text
    only, unique keys; `vector` is never set)."""
    out = []
    for part in manifest.get("parts", []):
        content = part.get("content") or {}
        if content.get("kind") == "text":
            out.append({"key": part["key"], "role": part["role"], "text": content["text"]})
            if len(out) == MAX_PARTS:
                break
    return out


def record_object(version: RecordVersion, enriched: bool, normalization: str = BUILTIN_NORMALIZATION) -> dict[str, Any]:
    """The subscription request's `record`. `enriched` is whether the Version has vectors in its
    Corpus's served vector space (false for a Corpus with none); `normalization` is `builtin` or
    the id of the normalizer plugin that produced the text Parts."""
    source: dict[str, Any] = {"namespace": version.namespace, "record_key": version.record_key}
    if version.position is not None:
        source["position"] = version.position
    provenance: dict[str, Any] = {"origin": version.provenance.get("origin") or "client"}
    for name in ("producer", "producer_version", "connector"):
        if version.provenance.get(name) is not None:
            provenance[name] = version.provenance[name]
    provenance["normalization"] = normalization
    return {"corpus_id": version.corpus_id, "record_id": version.record_id,
            "record_version_id": version.record_version_id, "enriched": bool(enriched),
            "parts": text_parts(version.manifest), "source": source, "accepted_at": version.accepted_at,
            "provenance": provenance, "extensions": dict(version.extensions or {})}

