"""The scopes a semantic search keeps (search/semantic_scopes.py): bounded by the labels they hold."""

from contentsvc.search.semantic_scopes import Scope, SemanticScopes


def _scope(n: int, first: int = 0) -> Scope:
    return Scope.of([(label, f"ver_{label}") for label in range(first, first + n)])


def test_the_labels_kept_stay_within_the_budget():
    scopes = SemanticScopes(max_labels=10)
    scopes._keep(("a",), 1, _scope(6))
    scopes._keep(("a",), 2, _scope(4))  # a newer read of the same scope replaces it
    assert scopes._held == 4 and scopes._kept[("a",)][0] == 2
    scopes._keep(("b",), 2, _scope(6))
    assert scopes._held == 10 and set(scopes._kept) == {("a",), ("b",)}
    scopes._keep(("c",), 2, _scope(3))  # past the budget: the cache starts again empty
    assert scopes._held == 3 and set(scopes._kept) == {("c",)}
    scopes._keep(("d",), 2, _scope(11))  # larger than the budget: never kept
    assert set(scopes._kept) == {("c",)}


def test_a_scope_lists_its_labels_for_the_graph_walk():
    scope = _scope(3, first=7)
    assert scope.labels.tolist() == [7, 8, 9] and scope.version_of[8] == "ver_8"
