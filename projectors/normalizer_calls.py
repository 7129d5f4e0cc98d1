"""Normalizer plugin calls for the materializer, and what their answers decide.

Part 2 "Plugin protocol" (normalizer request and response) and part 1 "Diagnostic". A Version
whose Blob Parts the plan routes to normalizer plugins is normalized in attempts: each attempt
invokes every routed Part (outside any database transaction), and `settle` decides from the
answers whether the Version is published, quarantined, or waits for another attempt. Pure
except for `attempt`, which does the I/O; so the rules are tested without a plugin.

- A terminal error is `normalizer_failed`; an answer breaking the response rules is
  `normalizer_invalid_output`; retryable errors and timeouts spend the manifest's retry budget
  (`retry.max_attempts`, capped at 5) and then give `normalizer_retries_exhausted` and
  `normalizer_timeout`. On an optional route each of those instead publishes the Part through
  the built-in text path with the code listed.
- An unreachable plugin is waited for without a diagnostic, except that work pinned to a plan
  no longer active stops after `pinned_plugin_attempts` (`pinned_plugin_unavailable`).
- Every attempt invokes every routed Part again with the same idempotency key; the first answer
  recorded for a Part is the one published, and a later one that differs is listed as
  `normalizer_conflict`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

from contentsvc.domain.decoding import nul_pointer
from contentsvc.domain.normalize import nfc
from contentsvc.ids import new_id
from contentsvc.plugins.client import PluginClient, PluginFailed, PluginUnreachable
from contentsvc.plugins.contract_check.normalizer import normalizer_response_schema
from contentsvc.plugins.plans import Provider
from contentsvc.storage.text import storable

MAX_NORMALIZER_ATTEMPTS = 5  # part 1: the manifest's retry.max_attempts, capped at 5
NORMALIZER_CODES_WITH_FALLBACK = frozenset({"normalizer_failed", "normalizer_invalid_output", "normalizer_timeout",
                                            "normalizer_retries_exhausted"})


@dataclass(frozen=True)
class Pin:
    """Receipt processing waiting for a normalizer plugin: the plan and registration it started
    under (decisions-part2: pinned work keeps them through retries and restarts) and the attempts
    spent, by kind."""

    plan_id: str
    registration_id: str
    attempts: int = 0  # attempts that did not answer
    budget_spent: int = 0  # attempts answered with a retryable error or timed out (the manifest's budget)


@dataclass(frozen=True)
class RoutedPart:
    """A Blob Part of a Version, the plugin its media type is routed to, and its request."""

    blob_id: str
    provider: Provider
    optional: bool
    request: dict[str, Any]


# ------------------------------------------------------------ what one invocation gave


@dataclass(frozen=True)
class Answered:
    parts: list[dict[str, Any]]
    invocation_id: str
    extensions: dict[str, Any] | None = None
    language: str | None = None


@dataclass(frozen=True)
class Refused:
    """A quarantining code: from the normalizer (`normalizer_failed`, `normalizer_invalid_output`)
    or the core's own check of the input (`input_unverified`)."""

    code: str
    message: str
    invocation_id: str | None


@dataclass(frozen=True)
class NotNow:
    """No answer this attempt: `retryable` (an error with `retryable: true`), `timeout`, `unreachable`."""

    cause: str
    message: str
    invocation_id: str


Outcome = Answered | Refused | NotNow


# ------------------------------------------------------------ what the attempt decides


@dataclass
class Publish:
    """Each routed Part's text Parts (None: the built-in text path, an optional route's fallback),
    the codes listed on the published Version, and what the answers said of the Version."""

    parts: dict[str, list[dict[str, Any]] | None]
    listed: list[dict[str, Any]] = field(default_factory=list)
    extensions: dict[str, Any] | None = None
    language: str | None = None


@dataclass(frozen=True)
class Quarantine:
    diagnostic: dict[str, Any]


@dataclass(frozen=True)
class Wait:
    pin: Pin
    answers: dict[str, dict[str, Any]]  # blob_id -> first recorded answer
    cause: str


Decision = Publish | Quarantine | Wait


def diagnostic(code: str, message: str, provider: Provider | None, invocation_id: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"code": code, "message": message, "retryable": False, "contribution": "normalizer"}
    if provider is not None:
        out["plugin"] = provider.plugin_id
    if invocation_id is not None:
        out["invocation_id"] = invocation_id
    return out


def settle(pin: Pin, routed: list[RoutedPart], outcomes: list[Outcome], recorded: dict[str, dict[str, Any]],
           pin_is_active: bool, pinned_plugin_attempts: int) -> Decision:
    """What one attempt over every routed Part of a Version decides (rules in the module docstring).
    `recorded`: the answers of earlier attempts, by blob_id."""
    unanswered = any(isinstance(o, NotNow) for o in outcomes)
    spends_budget = any(isinstance(o, NotNow) and o.cause != "unreachable" for o in outcomes)
    spent = Pin(pin.plan_id, pin.registration_id, pin.attempts + int(unanswered),
                pin.budget_spent + int(spends_budget))
    publish = Publish(parts={})
    answers = dict(recorded)
    waiting: list[str] = []
    for part, outcome in zip(routed, outcomes):
        provider = part.provider
        said = f"{provider.plugin_id} {provider.version}"
        if isinstance(outcome, NotNow):
            budget = min(provider.manifest.retry.max_attempts, MAX_NORMALIZER_ATTEMPTS)
            if outcome.cause != "unreachable" and spent.budget_spent >= budget:
                code = "normalizer_timeout" if outcome.cause == "timeout" else "normalizer_retries_exhausted"
                outcome = Refused(code, f"{outcome.message} ({spent.budget_spent} attempts, the manifest's retry "
                                        "budget)", outcome.invocation_id)
            elif outcome.cause == "unreachable" and not pin_is_active and spent.attempts >= pinned_plugin_attempts:
                return Quarantine(diagnostic(
                    "pinned_plugin_unavailable", f"Plan {pin.plan_id} pins {said}, which stayed unreachable for "
                    f"{spent.attempts} attempts: {outcome.message}", provider, outcome.invocation_id))
            else:
                waiting.append(outcome.message)
                continue
        if isinstance(outcome, Refused):
            refusal = diagnostic(outcome.code, outcome.message, provider if outcome.code != "input_unverified"
                                 else None, outcome.invocation_id)
            if part.optional and outcome.code in NORMALIZER_CODES_WITH_FALLBACK:
                publish.parts[part.blob_id] = None
                publish.listed.append(refusal)
                continue
            return Quarantine(refusal)
        first = answers.setdefault(part.blob_id, {"parts": outcome.parts, "extensions": outcome.extensions,
                                                  "language": outcome.language})
        if first["parts"] != outcome.parts:
            publish.listed.append(diagnostic(
                "normalizer_conflict", f"{said} answered idempotency key {part.request['idempotency_key']} with "
                "other Parts than it did before; the first recorded answer is kept.", provider,
                outcome.invocation_id))
        publish.parts[part.blob_id] = first["parts"]
        if first.get("extensions"):
            publish.extensions = {**(publish.extensions or {}), **first["extensions"]}
        publish.language = publish.language or first.get("language")
    if waiting:
        return Wait(spent, answers, waiting[0])
    return publish


# ------------------------------------------------------------ the I/O of one attempt


def normalizer_request(*, org_id: str, corpus_id: str, namespace: str, record_key: str, receipt_id: str,
                       record_id: str, version_id: str, blob_id: str, media_type: str, size_bytes: int,
                       sha256: str, url: str, provider: Provider, extensions: dict | None,
                       provenance: dict | None) -> dict[str, Any]:
    """Part 2 normalizer request, without its invocation_id (one per attempt)."""
    request: dict[str, Any] = {
        "idempotency_key": f"{receipt_id}:{blob_id}",  # stable across retries and restarts
        "contribution": "normalizer",
        "organization_id": org_id,
        "corpus_id": corpus_id,
        "record_id": record_id,
        "record_version_id": version_id,
        "source": {"corpus_id": corpus_id, "namespace": namespace, "record_key": record_key},
        "input": {"blob_id": blob_id, "media_type": media_type, "size_bytes": size_bytes, "sha256": sha256,
                  "reference": {"url": url}},
        "configuration": provider.settings.configuration,
    }
    if extensions:
        request["extensions"] = extensions
    if provenance:
        request["provenance"] = provenance
    return request


async def attempt(routed: list[RoutedPart], client_for: Callable[[Provider], PluginClient],
                  verify_input: Callable[[str], str | None]) -> list[Outcome]:
    """Invokes every routed Part at once. `verify_input(blob_id)` (run in a thread: it reads the
    Blob) answers why the Blob is no longer the verified input, or None."""

    async def one(part: RoutedPart) -> Outcome:
        unverified = await asyncio.to_thread(verify_input, part.blob_id)
        if unverified is not None:
            return Refused("input_unverified", unverified, None)
        return await invoke(client_for(part.provider), part)

    return list(await asyncio.gather(*(one(part) for part in routed)))


async def invoke(client: PluginClient, part: RoutedPart) -> Outcome:
    provider = part.provider
    invocation_id = new_id("inv")
    said = f"{provider.plugin_id} {provider.version}"
    try:
        answer = await client.invoke("normalizer", {"invocation_id": invocation_id, **part.request},
                                     float(provider.manifest.retry.timeout_seconds), invocation_id)
    except PluginFailed as exc:
        message = f"{said} answered {exc.code}: {exc.message}"
        if exc.retryable:
            return NotNow("retryable", message, invocation_id)
        return Refused("normalizer_failed", message, invocation_id)
    except PluginUnreachable as exc:
        return NotNow("timeout" if exc.cause == "timeout" else "unreachable", f"{exc.cause}: {exc.message}",
                      invocation_id)
    problem = answer_problem(answer, provider)
    if problem is not None:
        return Refused("normalizer_invalid_output", f"{said}: {problem}", invocation_id)
    return Answered([text_part(p) for p in answer["manifest"]["parts"]], invocation_id,
                    answer.get("extensions") or None, answer.get("language"))


def answer_problem(answer: dict[str, Any], provider: Provider) -> str | None:
    """Why a normalizer answer breaks part 2's response or part 1's Part rules (None: it keeps them).
    Only text Parts are published: a Blob Part would need a second normalization."""
    normalizer = provider.manifest.contributions.normalizer
    max_parts = normalizer.max_parts if normalizer is not None else 256
    namespaces = [x.namespace for x in normalizer.extensions] if normalizer is not None else []
    import jsonschema  # here: a worker that never calls a normalizer plugin does not load it

    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(normalizer_response_schema(max_parts, namespaces)).iter_errors(answer))
    if error is not None:
        where = "/" + "/".join(str(step) for step in error.absolute_path)
        return f"the answer breaks the normalizer response at {where}: {error.message[:200]}"
    if (at := nul_pointer(answer)) is not None:  # published, it would fail every later step of the fold
        return f"the answer holds U+0000 at {storable(at)}, which no stored text can"
    keys: set[str] = set()
    for part in answer["manifest"]["parts"]:
        if part["content"]["kind"] != "text":
            return f"Part {part['key']!r} is not text"
        if part["key"] in keys:
            return f"Part key {part['key']!r} appears twice"
        if part.get("parent_key") is not None and part["parent_key"] not in keys:
            return f"Part {part['key']!r} names a parent_key that is not an earlier Part"
        keys.add(part["key"])
    return None


def text_part(part: dict[str, Any]) -> dict[str, Any]:
    out = {"key": part["key"], "role": part["role"], "content": {"kind": "text", "text": nfc(part["content"]["text"])}}
    if part.get("parent_key") is not None:
        out["parent_key"] = part["parent_key"]
    if part.get("extensions"):
        out["extensions"] = part["extensions"]
    return out
