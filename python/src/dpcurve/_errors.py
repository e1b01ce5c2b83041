"""The exceptions of the client, built from the server's machine-readable error details.

`dpcurve serve` tags each error status with gRPC metadata: `dpcurve-error` says what kind of
error it is (`refused`, `budget-exhausted`, `no-share`, `unauthenticated`, `invalid`,
`resources-exhausted`, `catalog-unavailable`) and further entries carry its fields
(`dpcurve-rule`, `dpcurve-table`, `dpcurve-scope`, `dpcurve-cost-epsilon`, …). ADBC hands them
over as the error's `details`; nothing here parses the message text.
"""

from __future__ import annotations

from typing import Dict, Optional

import adbc_driver_manager


class Error(Exception):
    """Any error the server or the client reports. `kind` is the server's `dpcurve-error`
    entry (None when it sent none), `details` all of its `dpcurve-*` entries."""

    def __init__(self, message: str, kind: Optional[str] = None, details: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.details = dict(details or {})


class Refused(Error):
    """The planner's guard refused the query; `rule` names the rule (e.g. `no-raw-rows`).
    Nothing was read or charged."""

    @property
    def rule(self) -> Optional[str]:
        return self.details.get("dpcurve-rule")


class BudgetExhausted(Error):
    """The query costs more than what remains of the table's budget or of the analyst's share.
    Nothing was read or charged."""

    @property
    def table(self) -> Optional[str]:
        return self.details.get("dpcurve-table")

    @property
    def scope(self) -> Optional[str]:
        """`share` (the analyst's share is short) or `table` (the table's total is)."""
        return self.details.get("dpcurve-scope")

    def _number(self, key: str) -> Optional[float]:
        v = self.details.get(key)
        return None if v is None else float(v)

    @property
    def remaining(self) -> Dict[str, Optional[float]]:
        """What remains: `{"epsilon": …, "delta": …}`."""
        return {
            "epsilon": self._number("dpcurve-remaining-epsilon"),
            "delta": self._number("dpcurve-remaining-delta"),
        }

    @property
    def cost(self) -> Dict[str, Optional[float]]:
        """What the query would have cost: `{"epsilon": …, "delta": …}`."""
        return {"epsilon": self._number("dpcurve-cost-epsilon"), "delta": self._number("dpcurve-cost-delta")}


class NoShare(Error):
    """The analyst has no share of the table (`table`): the data owner grants one."""

    @property
    def table(self) -> Optional[str]:
        return self.details.get("dpcurve-table")


class AuthenticationError(Error):
    """The token (or user name and password) was missing or not accepted."""


class InvalidQuery(Error):
    """The statement is not valid SQL, names something unknown, or has a parameter out of range."""


class ResultNotKept(Error):
    """`reuse=True` found the statement paid for before, but its whole result was not kept
    (larger than the server keeps, or run outside the server); `releases` lists what was stored."""

    def __init__(self, message: str, releases):
        super().__init__(message, kind=None)
        self.releases = list(releases)


_KINDS = {
    "refused": Refused,
    "budget-exhausted": BudgetExhausted,
    "no-share": NoShare,
    "unauthenticated": AuthenticationError,
    "invalid": InvalidQuery,
}


def details_of(e: adbc_driver_manager.Error) -> Dict[str, str]:
    """The `dpcurve-*` metadata entries an ADBC error carries."""
    out = {}
    for k, v in getattr(e, "details", None) or []:
        k = k.decode() if isinstance(k, bytes) else str(k)
        if k.startswith("dpcurve-"):
            out[k] = v.decode() if isinstance(v, bytes) else str(v)
    return out


def translate(e: adbc_driver_manager.Error) -> Error:
    """The client exception for an ADBC error."""
    details = details_of(e)
    kind = details.get("dpcurve-error")
    cls = _KINDS.get(kind, Error)
    if kind is None and getattr(e, "status_code", None) == adbc_driver_manager.AdbcStatusCode.UNAUTHENTICATED:
        cls = AuthenticationError
    return cls(str(e), kind=kind, details=details)


def is_transport(e: adbc_driver_manager.Error) -> bool:
    """Whether the error is a lost connection rather than an answer of the server."""
    if details_of(e):
        return False
    return getattr(e, "status_code", None) in (
        adbc_driver_manager.AdbcStatusCode.IO,
        adbc_driver_manager.AdbcStatusCode.UNKNOWN,
        adbc_driver_manager.AdbcStatusCode.INTERNAL,
        adbc_driver_manager.AdbcStatusCode.TIMEOUT,
        adbc_driver_manager.AdbcStatusCode.CANCELLED,
    )
