"""The extension namespaces this deployment declares, and the check of a command's extensions.

Part 1 (Manifest content): `extensions` is a map keyed by plugin namespace, each
value `{schema_version, data}`, validated against the installed schema version.
No plugin is installed in this deployment, so the declared namespaces are the
built-in ones: the contract's illustrative `example` namespace (paired with the
built-in `example.editorial` profile) at schema version "1", whose `data` is any
object. A plugin that declares a namespace adds it here when plugins arrive.
Retrieval mappings may be rooted only at a declared namespace
(`/extensions/{namespace}`), and commands may carry only declared namespaces.
"""

from __future__ import annotations

from collections.abc import Mapping

from contentsvc.domain.decoding import pointer_token
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import Extension

INSTALLED_SCHEMA_VERSIONS: Mapping[str, tuple[str, ...]] = {"example": ("1",)}
DECLARED_NAMESPACES = tuple(INSTALLED_SCHEMA_VERSIONS)


def check_extensions(extensions: Mapping[str, Extension] | None, pointer: str) -> None:
    """422 invalid_schema with `field` at the first undeclared namespace, or at the
    `schema_version` no installed schema of its namespace has."""
    for namespace, extension in (extensions or {}).items():
        field = f"{pointer}/{pointer_token(namespace)}"
        installed = INSTALLED_SCHEMA_VERSIONS.get(namespace)
        if installed is None:
            raise ApiError(422, "invalid_schema",
                           f"Extension namespace {namespace!r} is not declared in this deployment; declared: "
                           f"{', '.join(DECLARED_NAMESPACES)}.", field=field)
        if extension.schema_version not in installed:
            raise ApiError(422, "invalid_schema",
                           f"Extension namespace {namespace!r} has no installed schema version "
                           f"{extension.schema_version!r}; installed: {', '.join(installed)}.",
                           field=f"{field}/schema_version")
