"""Schemathesis hooks of `make fuzz` (SCHEMATHESIS_HOOKS): bodies whose shape the document cannot
give, because the Connector's kind declares it, are drawn half as generated and half in that shape,
so that generated requests also reach the code behind the kind's schema.

- replaceConnectorCredential: `secret` is any object in the document; the fixture kind's credential
  schema takes `{token}`.
- The declared push routes (pushConnectorAPI and its methods): any JSON in the document; the fixture
  kind's routes take `{items: [...]}`, each item `{record_key, revision, text}` with an optional
  `title` (part 2, Push routes; decisions-part2, Built-in `fixture` kind).

Only values the document already admits are drawn (an object stays an object, the push body is any
JSON), so a case generated to be refused stays one.
"""

from __future__ import annotations

import schemathesis
from hypothesis import strategies as st

CREDENTIAL = "PUT /v0/connectors/{connector_id}/credential"
PUSH_PATH = "/v0/connectors/{connector_id}/api/{path}"

_text = st.text(min_size=1, max_size=40)
_item = st.fixed_dictionaries({"record_key": _text, "revision": _text, "text": _text},
                              optional={"title": _text, "withdraw": st.booleans()})
# Items as the kind takes them, and some that are not (a member missing, not an object at all).
_items = st.lists(st.one_of(_item, _item.map(lambda i: {k: v for k, v in i.items() if k != "text"}),
                            st.dictionaries(_text, _text, max_size=2), st.integers()), max_size=3)


@schemathesis.hook
def flatmap_body(ctx, body):
    operation = ctx.operation
    if operation is None:
        return st.just(body)
    if operation.label == CREDENTIAL and isinstance(body, dict) and isinstance(body.get("secret"), dict):
        return st.sampled_from([body, {**body, "secret": {"token": "fuzz-credential"}}])
    if operation.path == PUSH_PATH:
        return st.one_of(st.just(body), st.fixed_dictionaries({"items": _items}))
    return st.just(body)
