"""The one Error envelope of the contract, raised anywhere and rendered once."""

from __future__ import annotations


class ApiError(Exception):
    """An error answer: HTTP status plus the Error object of part 1."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        field: str | None = None,
        resync_url: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.field = field
        self.resync_url = resync_url
        self.headers = headers or {}

    def body(self) -> dict:
        out = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.field is not None:
            out["field"] = self.field
        if self.resync_url is not None:
            out["resync_url"] = self.resync_url
        return out


def not_found(what: str = "resource") -> ApiError:
    return ApiError(404, "not_found", f"No such {what}.")


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def invalid_schema(message: str, field: str | None) -> ApiError:
    return ApiError(422, "invalid_schema", message, field=field)


def invalid_input(message: str, field: str) -> ApiError:
    return ApiError(422, "invalid_input", message, field=field)


def server_busy() -> ApiError:
    """Every database connection of the API process stayed in use for `pool_wait_seconds`."""
    return ApiError(429, "server_busy", "The service is busy with other requests; retry shortly.", retryable=True,
                    headers={"Retry-After": "1"})


def storage_unavailable(retry_after_seconds: int | None = None, what: str = "The database is unavailable") -> ApiError:
    headers = {"Retry-After": str(retry_after_seconds)} if retry_after_seconds is not None else None
    return ApiError(503, "storage_unavailable", f"{what}; retry later.", retryable=True, headers=headers)
