"""The subscription request the service sends an evaluator, and the checks of its answer (part 2
"Plugin protocol" > Subscription request / response; decisions-part2 "Evaluation trigger and
eligibility").

Pure: no I/O, no clock, no randomness, so the preview (monitoring/previews.py) and the `monitor`
worker build byte-identical requests for the same Version and evaluations, and tests can check
them without a server. Callers read the Version from the read model and pass plain values in:

    record = record_object(RecordVersion(...), enriched=row["enriched"], normalization="builtin")
    evaluations = deduplicated([Evaluation(expression, configuration, [subscription_ref, ...]), ...])
    for batch in batches(evaluations, contribution.max_batch_size):
        body = subscription_request(invocation_id, org_id, record, batch, plugin_configuration)
        answer = await client.invoke("subscription", body, timeout)
        decisions = checked_decisions(answer, body)   # InvalidOutput -> evaluator_invalid_output

Ids: `evaluations[].id` = `e1`, `e2` ... in request order; `idempotency_key` = sha256 of the
record_version_id and the sorted evaluation fingerprints (a fingerprint is the sha256 of the
canonical JSON of the expression and configuration), so a retry of the same batch carries the
same key and the plugin answers the same decisions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import msgspec

MAX_PARTS = 256  # part 2 Limits: record parts at most 256
MAX_EVALUATIONS = 256  # part 2 Limits: evaluations per subscription request 1..256
MAX_DECISIONS = 256
MAX_EXPLANATION_CHARS = 4096
MAX_PART_KEYS = 100
MAX_DETAILS_BYTES = 16 * 1024
DECISIONS = ("match", "no_match", "not_ready")
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


@dataclass(frozen=True)
class Evaluation:
    """One (expression, configuration) pair to decide, and the Subscriptions sharing it
    (`{subscription_id, subscription_version_id, saved_query_id, saved_query_version_id, owner}`;
    informational for the plugin, empty for a preview)."""

    expression: dict[str, Any]
    configuration: dict[str, Any]
    subscriptions: tuple[dict[str, Any], ...] = field(default=())

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.expression, self.configuration)


def fingerprint(expression: dict[str, Any], configuration: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted members) of the pair: equal pairs, equal fingerprints."""
    encoded = msgspec.json.encode({"configuration": configuration, "expression": expression}, order="sorted")
    return hashlib.sha256(encoded).hexdigest()


def deduplicated(evaluations: Iterable[Evaluation]) -> list[Evaluation]:
    """part 2: identical expression and configuration are sent once, with every Subscription of
    them; first-seen order is kept."""
    merged: dict[str, Evaluation] = {}
    for e in evaluations:
        seen = merged.get(e.fingerprint)
        merged[e.fingerprint] = e if seen is None else Evaluation(seen.expression, seen.configuration,
                                                                   seen.subscriptions + e.subscriptions)
    return list(merged.values())


def batches(evaluations: list[Evaluation], max_batch_size: int) -> list[list[Evaluation]]:
    """Never more than the manifest's `max_batch_size` (nor 256) evaluations per request."""
    size = max(1, min(max_batch_size, MAX_EVALUATIONS))
    return [evaluations[i:i + size] for i in range(0, len(evaluations), size)]


def idempotency_key(record_version_id: str, evaluations: list[Evaluation]) -> str:
    """decisions-part2: sha256 of the record_version_id and the sorted evaluation fingerprints."""
    h = hashlib.sha256(record_version_id.encode("utf-8"))
    for fp in sorted(e.fingerprint for e in evaluations):
        h.update(b"\n" + fp.encode("ascii"))
    return h.hexdigest()


def subscription_request(invocation_id: str, organization_id: str, record: dict[str, Any],
                         evaluations: list[Evaluation], configuration: dict[str, Any]) -> dict[str, Any]:
    """One request for one batch; `configuration` is the plugin's installed configuration, each
    evaluation's `configuration` the Subscription's evaluator configuration."""
    return {
        "invocation_id": invocation_id,
        "idempotency_key": idempotency_key(record["record_version_id"], evaluations),
        "contribution": "subscription",
        "organization_id": organization_id,
        "record": record,
        "evaluations": [{"id": f"e{n}", "expression": e.expression, "configuration": e.configuration,
                         "subscriptions": list(e.subscriptions)} for n, e in enumerate(evaluations, start=1)],
        "configuration": configuration,
    }


class InvalidOutput(Exception):
    """The evaluator's answer breaks part 2's response rules (decisions-part2: `match` without
    evidence, unknown `part_keys`, unknown or missing `id`, oversize)."""


def checked_decisions(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The answer's decisions by evaluation id (`{decision, evidence?}`), one for every evaluation
    of `request`, else InvalidOutput naming the first problem."""
    decisions = answer.get("decisions")
    if not isinstance(decisions, list) or len(decisions) > MAX_DECISIONS:
        raise InvalidOutput("decisions must be an array of at most 256 items")
    ids = {e["id"] for e in request["evaluations"]}
    part_keys = {p["key"] for p in request["record"]["parts"]}
    out: dict[str, dict[str, Any]] = {}
    for n, d in enumerate(decisions):
        if not isinstance(d, dict) or d.get("id") not in ids or d["id"] in out:
            raise InvalidOutput(f"decisions/{n}: id must name an evaluation of the request, once")
        if d.get("decision") not in DECISIONS:
            raise InvalidOutput(f"decisions/{n}/decision must be one of {', '.join(DECISIONS)}")
        evidence = d.get("evidence")
        if evidence is None:
            if d["decision"] == "match":
                raise InvalidOutput(f"decisions/{n}: a match needs evidence")
            out[d["id"]] = {"decision": d["decision"]}
            continue
        out[d["id"]] = {"decision": d["decision"], "evidence": _checked_evidence(evidence, part_keys, n)}
    missing = sorted(ids - set(out), key=lambda i: int(i[1:]))
    if missing:
        raise InvalidOutput(f"no decision for {missing[0]}")
    return out


def _checked_evidence(evidence: Any, part_keys: set[str], n: int) -> dict[str, Any]:
    where = f"decisions/{n}/evidence"
    if not isinstance(evidence, dict):
        raise InvalidOutput(f"{where} must be an object")
    explanation = evidence.get("explanation")
    if not isinstance(explanation, str) or not 1 <= len(explanation) <= MAX_EXPLANATION_CHARS:
        raise InvalidOutput(f"{where}/explanation must be 1..4096 characters")
    keys = evidence.get("part_keys", [])
    if not isinstance(keys, list) or len(keys) > MAX_PART_KEYS or not all(isinstance(k, str) for k in keys):
        raise InvalidOutput(f"{where}/part_keys must be at most 100 strings")
    unknown = [k for k in keys if k not in part_keys]
    if unknown:
        raise InvalidOutput(f"{where}/part_keys: {unknown[0]!r} is not a Part of the request")
    details = evidence.get("details", {})
    if not isinstance(details, dict) or len(msgspec.json.encode(details)) > MAX_DETAILS_BYTES:
        raise InvalidOutput(f"{where}/details must be an object of at most 16 KiB serialized")
    return {"explanation": explanation, "part_keys": keys, "details": details}
