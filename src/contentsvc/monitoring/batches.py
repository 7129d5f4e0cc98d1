"""How one transition's pending evaluations become subscription requests, and how an answer is
checked (part 2 "Subscription request"; decisions-part2 "Evaluation trigger and eligibility").
Pure: no I/O, so the rules are tested directly.

- Subscriptions with identical (expression, configuration) are one evaluation: the pair's
  fingerprint is the sha256 of its canonical JSON (sorted keys, compact).
- Evaluations are ordered by fingerprint and split at the manifest's `max_batch_size`; ids are
  `e1`, `e2` ... in request order.
- `idempotency_key` = sha256 over the record_version_id and the request's sorted fingerprints, so
  the same Version and the same evaluations always give the same key (a retry, a restart).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from contentsvc.domain.decoding import nul_pointer
from contentsvc.storage.text import storable

MAX_EVALUATIONS = 256  # part 2 Limits: evaluations per request, decisions per answer
MAX_PART_KEYS = 100
MAX_EXPLANATION_CHARS = 4096
MAX_DETAILS_BYTES = 16 * 1024
DECISIONS = ("match", "no_match", "not_ready")


@dataclass(frozen=True)
class Pending:
    """One pending evaluation of a Record Version by one Subscription Version."""

    subscription_id: str
    subscription_version_id: str
    saved_query_id: str
    saved_query_version_id: str
    owner: str | None
    expression: dict[str, Any]
    configuration: dict[str, Any]


@dataclass(frozen=True)
class Batch:
    """One request's evaluations, and which pending evaluations each `id` answers for."""

    idempotency_key: str
    evaluations: list[dict[str, Any]]
    members: dict[str, list[Pending]] = field(default_factory=dict)  # evaluation id -> its Subscriptions

    @property
    def ids(self) -> list[str]:
        return [e["id"] for e in self.evaluations]


def fingerprint(expression: dict[str, Any], configuration: dict[str, Any]) -> str:
    canonical = json.dumps({"configuration": configuration, "expression": expression}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def idempotency_key(record_version_id: str, fingerprints: list[str]) -> str:
    h = hashlib.sha256(record_version_id.encode("utf-8"))
    for f in sorted(fingerprints):
        h.update(b"\n" + f.encode("ascii"))
    return h.hexdigest()


def plan_batches(record_version_id: str, pending: list[Pending], max_batch_size: int,
                 fingerprints: dict[str, str] | None = None) -> list[Batch]:
    """The requests for one Record Version and one evaluator: deduplicated, ordered, split.
    `fingerprints` may give the fingerprint of a Subscription Version's pair already computed
    (a Subscription Version never changes); the others are computed here."""
    size = max(1, min(max_batch_size, MAX_EVALUATIONS))
    known = fingerprints or {}
    groups: dict[str, list[Pending]] = {}
    for p in pending:
        fp = known.get(p.subscription_version_id) or fingerprint(p.expression, p.configuration)
        groups.setdefault(fp, []).append(p)
    ordered = sorted(groups)
    batches = []
    for start in range(0, len(ordered), size):
        chunk = ordered[start:start + size]
        evaluations, members = [], {}
        for n, fp in enumerate(chunk, start=1):
            subs = sorted(groups[fp], key=lambda p: p.subscription_version_id)
            first = subs[0]
            eid = f"e{n}"
            members[eid] = subs
            evaluations.append({
                "id": eid, "expression": first.expression, "configuration": first.configuration,
                # informational only: decisions must not depend on them
                "subscriptions": [{"subscription_id": s.subscription_id,
                                   "subscription_version_id": s.subscription_version_id,
                                   "saved_query_id": s.saved_query_id,
                                   "saved_query_version_id": s.saved_query_version_id,
                                   **({"owner": s.owner} if s.owner is not None else {})} for s in subs]})
        batches.append(Batch(idempotency_key(record_version_id, chunk), evaluations, members))
    return batches


def preview_batch(record_version_id: str, expression: dict[str, Any], configuration: dict[str, Any]) -> Batch:
    """A preview's request: one evaluation, no Subscription behind it."""
    return Batch(idempotency_key(record_version_id, [fingerprint(expression, configuration)]),
                 [{"id": "e1", "expression": expression, "configuration": configuration, "subscriptions": []}])


def part_keys(record: dict[str, Any]) -> set[str]:
    return {part["key"] for part in record["parts"]}


def subscription_request(invocation_id: str, organization_id: str, record: dict[str, Any], batch: Batch,
                         configuration: dict[str, Any]) -> dict[str, Any]:
    """One request for one batch; `configuration` is the plugin's installed configuration, each
    evaluation's `configuration` the Subscription's evaluator configuration."""
    return {"invocation_id": invocation_id, "idempotency_key": batch.idempotency_key,
            "contribution": "subscription", "organization_id": organization_id, "record": record,
            "evaluations": batch.evaluations, "configuration": configuration}


class InvalidOutput(Exception):
    """The answer breaks part 2's response rules: no Match, `evaluator_invalid_output`."""


def check_answer(answer: Any, ids: list[str], part_keys: set[str]) -> dict[str, dict[str, Any]]:
    """The decisions by id, each `{decision, evidence?}`; InvalidOutput when the answer is not one:
    not `{decisions: [...]}`, an unknown, repeated or missing id, an unknown decision, `match`
    without evidence, an explanation outside 1..4096 code points, more than 100 part_keys or one
    not in the request, details over 16 KiB or not an object, evidence holding U+0000."""
    decisions = answer.get("decisions") if isinstance(answer, dict) else None
    if not isinstance(decisions, list) or len(decisions) > MAX_EVALUATIONS:
        raise InvalidOutput("the answer has no decisions array of at most 256")
    out: dict[str, dict[str, Any]] = {}
    for n, d in enumerate(decisions):
        if not isinstance(d, dict) or not isinstance(d.get("id"), str):
            raise InvalidOutput(f"decisions/{n} has no id")
        if d["id"] not in ids or d["id"] in out:
            raise InvalidOutput(f"decisions/{n} names an unknown or repeated id {d['id']!r}")
        if d.get("decision") not in DECISIONS:
            raise InvalidOutput(f"decisions/{n} has no decision of {', '.join(DECISIONS)}")
        evidence = d.get("evidence")
        if evidence is not None or d["decision"] == "match":
            evidence = _checked_evidence(evidence, part_keys, n)
        out[d["id"]] = {"decision": d["decision"], **({"evidence": evidence} if evidence is not None else {})}
    missing = [i for i in ids if i not in out]
    if missing:
        raise InvalidOutput(f"no decision for {', '.join(missing)}")
    return out


def _checked_evidence(evidence: Any, part_keys: set[str], n: int) -> dict[str, Any]:
    where = f"decisions/{n}/evidence"
    if not isinstance(evidence, dict):
        raise InvalidOutput(f"{where} is required for match and must be an object")
    explanation = evidence.get("explanation")
    if not isinstance(explanation, str) or not 1 <= len(explanation) <= MAX_EXPLANATION_CHARS:
        raise InvalidOutput(f"{where}/explanation must be 1..4096 characters")
    keys = evidence.get("part_keys", [])
    if not isinstance(keys, list) or len(keys) > MAX_PART_KEYS or not all(isinstance(k, str) for k in keys):
        raise InvalidOutput(f"{where}/part_keys must be at most 100 strings")
    unknown = [k for k in keys if k not in part_keys]
    if unknown:
        raise InvalidOutput(f"{where}/part_keys names {unknown[0]!r}, not a Part of the request")
    details = evidence.get("details", {})
    if not isinstance(details, dict):
        raise InvalidOutput(f"{where}/details must be an object")
    if len(json.dumps(details, separators=(",", ":")).encode("utf-8")) > MAX_DETAILS_BYTES:
        raise InvalidOutput(f"{where}/details exceeds 16 KiB")
    if (at := nul_pointer({"explanation": explanation, "details": details})) is not None:
        raise InvalidOutput(f"{where}{storable(at)} holds U+0000, which no stored text can")
    return {"explanation": explanation, "part_keys": keys, "details": details}
