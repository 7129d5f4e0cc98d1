"""Request decoding: 400 malformed_json vs 422 invalid_schema with a JSON Pointer (decisions.md Errors)."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from contentsvc.domain.decoding import MAX_JSON_DEPTH, decode_body, msgspec_path_to_pointer, nul_pointer, too_deep
from contentsvc.domain.models import IngestCommand
from contentsvc.domain.errors import ApiError

GOOD = b'{"idempotency_key":"k","source":{"corpus_id":"c","namespace":"n","record_key":"r"},"content":{"kind":"text","text":"x"}}'


def error_of(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        decode_body(raw, IngestCommand)
    return info.value


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b"42", b'"s"', b"null", b"\xff\xfe"])
def test_not_a_json_object_is_400(raw):
    err = error_of(raw)
    assert (err.status, err.code) == (400, "malformed_json")


@pytest.mark.parametrize(
    ("raw", "pointer"),
    [
        (GOOD.replace(b'"corpus_id":"c"', b'"corpus_id":1'), "/source/corpus_id"),
        (GOOD.replace(b',"text":"x"', b""), "/content/text"),
        (GOOD[:-1] + b',"extra":1}', "/extra"),
        (GOOD.replace(b'"text":"x"', b'"text":""'), "/content/text"),
        (GOOD.replace(b'"kind":"text"', b'"kind":"nope"'), "/content/kind"),
    ],
)
def test_wrong_member_is_422_with_pointer(raw, pointer):
    err = error_of(raw)
    assert (err.status, err.code, err.field) == (422, "invalid_schema", pointer)


@given(st.lists(st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), st.integers(0, 999)),
                max_size=6))
def test_paths_become_rfc6901_pointers(tokens):
    path = "$" + "".join(f"[{t}]" if isinstance(t, int) else f".{t}" for t in tokens)
    pointer, exact = msgspec_path_to_pointer(path)
    assert exact and pointer == "".join(f"/{t}" for t in tokens)


def test_map_keys_stop_the_pointer_at_the_map():
    assert msgspec_path_to_pointer("$.extensions[...].data") == ("/extensions", False)


# decisions.md Errors: the nesting bound and U+0000, checked before anything walks the body.
@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=5))
def test_too_deep_counts_nesting_not_brackets(depth, siblings):
    nested = "[" * depth + "]" * depth
    raw = ('{"a": [%s], "s": "%s"}' % (",".join([nested] * (siblings + 1)), "[{" * 100)).encode()
    assert too_deep(raw) == (depth + 2 > MAX_JSON_DEPTH)  # the outer object and array count too


def test_nul_pointer_names_the_first_member_holding_it():
    assert nul_pointer({"a": ["x", "y\x00"], "b": "z\x00"}) == "/a/1"
    assert nul_pointer({"a/b": {"c\x00": 1}}) == "/a~1b/c\x00"
    assert nul_pointer({"entries": ["\x00"], "k": "ok"}, frozenset({"entries"})) is None
    assert nul_pointer({"fine": [1, 2, {"x": "y"}]}) is None


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)


_with_nul = st.recursive(
    st.one_of(st.text(alphabet="a\x00\\u0", max_size=6), st.integers(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(alphabet="a\x00\\u0", max_size=6), inner, max_size=3)),
    max_leaves=8)


@given(_with_nul)
def test_nul_pointer_finds_u0000_exactly_when_a_string_holds_it(value):
    # decisions.md Bad input: U+0000 anywhere is refused; the encoded-bytes shortcut never hides one,
    # and a literal backslash-u0000 in a string is not one
    assert (nul_pointer(value) is not None) == any("\x00" in s for s in _strings(value))


_tricky = st.text(alphabet='ab"\\[]{}\u00e9/', max_size=8)  # quotes, backslashes and brackets in strings
_json_values = st.recursive(
    st.one_of(_tricky, st.integers(), st.none(), st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_tricky, inner, max_size=3)),
    max_leaves=8)


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=300)
@given(_json_values, st.lists(st.sampled_from(["array", "object"]), max_size=130), _tricky, st.booleans(),
       st.integers(0, 3))
def test_too_deep_measures_the_nesting_of_any_json(value, wrappers, key, ascii, siblings):
    # decisions.md Errors: nesting deeper than 64 levels is refused, brackets inside strings
    # (escaped quotes and backslashes before them included) do not count
    for wrapper in wrappers:
        value = [value, *range(siblings)] if wrapper == "array" else {key: value}
    raw = json.dumps(value, ensure_ascii=ascii).encode()
    assert too_deep(raw) == (_depth(value) > MAX_JSON_DEPTH)


@settings(max_examples=300)
@given(st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 2), st.text(alphabet='a"\\[]{}', max_size=12),
       st.booleans())
def test_brackets_after_escaped_quotes_do_not_count(levels, text, as_key):
    # decisions.md Errors: a string's quotes and backslashes (escaped in the JSON) end no
    # string early, so the brackets after them inside it count for nothing, at the limit too
    value = {text: 1} if as_key else text
    for _ in range(levels):
        value = [value]
    raw = json.dumps(value).encode()
    assert too_deep(raw) == (_depth(value) > MAX_JSON_DEPTH)
