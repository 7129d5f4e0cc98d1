"""The first-party `fixture-evaluator` subscription plugin (decisions-part2): deterministic,
no clock, no randomness, so tests of monitoring can say exactly what it will decide.

An expression is exactly one of `{contains}` (case-insensitive substring over the text
Parts), `{decision}` (that decision), `{fail}` (the error body `fixture_failure`,
retryable or terminal), with an optional `require_enriched: true` that answers
`not_ready` while `record.enriched` is false.
"""

from __future__ import annotations

from pathlib import Path

from jsonschema import Draft202012Validator

from contentsvc_plugins.server import Plugin, PluginError, evaluation_batch, terminal

FOLDER = Path(__file__).resolve().parent


def build() -> Plugin:
    plugin = Plugin(folder=FOLDER, handlers={})
    subscription = plugin.pinned.manifest.contributions.subscription
    evaluator = Evaluator(Draft202012Validator(subscription.expression_schema), subscription.max_batch_size)
    plugin.handlers["subscription"] = evaluator.evaluate
    return plugin


class Evaluator:
    def __init__(self, expressions: Draft202012Validator, max_batch_size: int):
        self.expressions = expressions
        self.max_batch_size = max_batch_size

    def evaluate(self, request: dict) -> dict:
        record, evaluations, parts = evaluation_batch(request, self.max_batch_size)
        return {"decisions": [self._decide(n, evaluation, record, parts) for n, evaluation in enumerate(evaluations)]}

    def _decide(self, n: int, evaluation: object, record: dict, parts: list[dict]) -> dict:
        if not isinstance(evaluation, dict) or not isinstance(evaluation.get("id"), str):
            raise terminal("invalid_request", f"evaluations/{n} needs an id", 400)
        expression = evaluation.get("expression")
        error = next(iter(self.expressions.iter_errors(expression)), None)
        if error is not None:
            raise terminal("invalid_expression", f"evaluations/{n}/expression: {error.message}")
        if "fail" in expression:
            retryable = expression["fail"] == "retryable"
            raise PluginError(503 if retryable else 422, "fixture_failure",
                              f"the expression asks for a {expression['fail']} failure", retryable=retryable)
        answer = {"id": evaluation["id"]}
        if expression.get("require_enriched") and not record.get("enriched"):
            return {**answer, "decision": "not_ready"}
        if "decision" in expression:
            decision = expression["decision"]
            if decision == "match":
                return {**answer, "decision": "match",
                        "evidence": {"explanation": 'decision "match"', "part_keys": []}}
            return {**answer, "decision": decision}
        word = expression["contains"]
        needle = word.casefold()
        keys = [part["key"] for part in parts
                if isinstance(part.get("text"), str) and needle in part["text"].casefold()][:100]
        if not keys:
            return {**answer, "decision": "no_match"}
        return {**answer, "decision": "match", "evidence": {"explanation": f'contains "{word}"', "part_keys": keys}}
