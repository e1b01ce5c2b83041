"""A connection to `dpcurve serve` that speaks in DataFrames and curves (over ADBC Flight SQL)."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Dict, Iterable, List, Optional

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pandas as pd
import pyarrow as pa

from ._errors import Error, ResultNotKept, is_transport, translate
from ._frames import curve_columns, curve_frame

_RELEASE_ID = re.compile(r"^r[0-9]+$")


def connect(
    uri: str,
    token: Optional[str] = None,
    *,
    username: Optional[str] = None,
    password: Optional[str] = None,
    tls_root_certs: Optional[str] = None,
    recover_timeout: float = 30.0,
) -> "Database":
    """Connects to a `dpcurve serve` server.

    `uri` is `grpc://host:port` or `grpc+tls://host:port`; `token` is the analyst's token (or give
    `username` and `password`); `tls_root_certs` is the PEM text, or a path to a PEM file, of the
    certificates to trust (a self-signed server's own certificate). `recover_timeout` is how long
    a call whose connection dropped after it was paid waits for the server to keep its result.
    """
    kwargs: Dict[str, str] = {}
    if token is not None:
        kwargs["adbc.flight.sql.authorization_header"] = "Bearer " + token
    if username is not None or password is not None:
        kwargs["username"] = username or ""
        kwargs["password"] = password or ""
    if tls_root_certs is not None:
        pem = tls_root_certs
        if "-----BEGIN" not in pem and os.path.exists(pem):
            with open(pem) as f:
                pem = f.read()
        kwargs["adbc.flight.sql.client_option.tls_root_certs"] = pem
    return Database(uri, kwargs, recover_timeout)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class Database:
    """An analyst's connection (see `connect`). Use as a context manager, or call `close()`."""

    def __init__(self, uri: str, db_kwargs: Dict[str, str], recover_timeout: float):
        self._uri, self._kwargs, self._recover_timeout = uri, db_kwargs, recover_timeout
        self._conn = self._open()

    def _open(self):
        try:
            # autocommit: dpcurve sessions are read-only (no transactions); ADBC warns without it.
            conn = flightsql.connect(self._uri, db_kwargs=self._kwargs, autocommit=True)
            with conn.cursor() as cur:  # authenticate now, not at the first query
                cur.execute("SELECT 1")
                cur.fetch_arrow_table()
            return conn
        except adbc_driver_manager.Error as e:
            raise translate(e) from e

    def close(self) -> None:
        """Closes the connection."""
        try:
            self._conn.close()
        except adbc_driver_manager.Error:
            pass

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plain queries ---------------------------------------------------------------------

    def arrow(self, query: str) -> pa.Table:
        """Runs `query`; its result as an Arrow table."""
        try:
            with self._conn.cursor() as cur:
                cur.execute(query)
                return cur.fetch_arrow_table()
        except adbc_driver_manager.Error as e:
            raise translate(e) from e

    def sql(self, query: str) -> pd.DataFrame:
        """Runs any query; its result as a DataFrame (struct columns left as dicts)."""
        return self.arrow(query).to_pandas()

    def budgets(self) -> pd.DataFrame:
        """The analyst's shares of the private tables and what remains (`dpcurve.budgets`)."""
        return self.sql("SELECT * FROM dpcurve.budgets")

    def releases(self) -> pd.DataFrame:
        """The analyst's stored releases (`dpcurve.releases`), oldest first."""
        return self.sql("SELECT * FROM dpcurve.releases ORDER BY execution, release")

    def results(self) -> pd.DataFrame:
        """The paid executions whose whole results the server kept (`dpcurve.results`)."""
        return self.sql("SELECT * FROM dpcurve.results ORDER BY execution")

    # -- curves ----------------------------------------------------------------------------

    def release(self, release_id: str) -> pd.DataFrame:
        """A stored release as a curve DataFrame; free (reads no table, spends no budget)."""
        if not _RELEASE_ID.match(release_id):
            raise Error(f"not a release id: {release_id!r} (ids look like 'r17')")
        df = curve_frame(self.arrow(f"SELECT * FROM release({_quote(release_id)})"))
        self._describe(df, charged=False)
        return df

    def curve(self, query: str, reuse: bool = True) -> pd.DataFrame:
        """Runs a query whose result has one private curve column; one row per curve point.

        With `reuse=True` (the default) a statement this analyst already paid for — the same
        statement, whatever its layout — is not paid again: its kept result comes back with `attrs["reused"] = True`.
        `reuse=False` pays for a fresh release. A paid result whose connection dropped is
        recovered from what the server kept (`attrs["recovered"] = True`).
        """
        digest = self._statement_sha256(query)
        before = self._last_execution(digest)
        if reuse and before >= 0:
            return self._reuse(digest, before)
        try:
            table = self.arrow(query)
        except Error as e:
            cause = e.__cause__
            if not (isinstance(cause, adbc_driver_manager.Error) and is_transport(cause)):
                raise
            recovered = self._recover(digest, before)
            if recovered is None:
                raise
            return recovered
        if len(curve_columns(table.schema)) != 1:
            raise Error("db.curve expects a result with exactly one private curve column; use db.sql")
        df = curve_frame(table)
        self._describe(df, charged=True)
        return df

    def _statement_sha256(self, query: str) -> str:
        """The hash under which the server's ledger records `query` (its parsed, normalised form:
        layout and comments do not change it, any other change does)."""
        t = self.arrow(f"SELECT statement_sha256({_quote(query)}) AS h")
        return t.column(0)[0].as_py()

    def _last_execution(self, digest: str) -> int:
        t = self.arrow(
            f"SELECT max(execution) AS e FROM dpcurve.releases WHERE statement_sha256 = {_quote(digest)}"
        )
        v = t.column(0)[0].as_py()
        return -1 if v is None else int(v)

    def _kept_result(self, digest: str, after: int) -> Optional[int]:
        t = self.arrow(
            "SELECT max(execution) AS e FROM dpcurve.results "
            f"WHERE statement_sha256 = {_quote(digest)} AND execution > {int(after)}"
        )
        v = t.column(0)[0].as_py()
        return None if v is None else int(v)

    def _from_kept(self, execution: int, flag: str) -> pd.DataFrame:
        df = curve_frame(self.arrow(f"SELECT * FROM stored_result({int(execution)})"))
        self._describe(df, charged=False)
        df.attrs[flag] = True
        df.attrs["execution"] = execution
        return df

    def _reuse(self, digest: str, last: int) -> pd.DataFrame:
        """The newest kept result of the statement this analyst paid for (newest execution
        `last`), or that execution's stored releases."""
        execution = self._kept_result(digest, -1)
        if execution is not None:
            return self._from_kept(execution, "reused")
        return self._from_releases(last, "reused")

    def _from_releases(self, execution: int, flag: str) -> pd.DataFrame:
        """A paid execution whose whole result was not kept: one release is a whole curve,
        rebuilt free; several raise `ResultNotKept` (never paid again)."""
        ids = self._execution_releases(execution)
        if len(ids) == 1:
            df = self.release(ids[0])
            df.attrs[flag] = True
            df.attrs["execution"] = execution
            return df
        raise ResultNotKept(
            f"this statement was paid for (execution {execution}) but its whole result was not kept; its "
            f"releases are stored ({', '.join(ids)}): read them free with db.release(id), or call "
            "db.curve(sql, reuse=False) to pay for a fresh release",
            ids,
        )

    def _execution_releases(self, execution: int) -> List[str]:
        t = self.arrow(f"SELECT release FROM dpcurve.releases WHERE execution = {int(execution)} ORDER BY release")
        return [r for r in t.column(0).to_pylist()]

    def _recover(self, digest: str, before: int) -> Optional[pd.DataFrame]:
        """After a dropped connection: the execution the call paid for (one newer than `before`)
        — its kept result once the server has kept it, else, after a grace period, its stored
        releases. None when nothing was paid (the caller re-raises)."""
        self.close()
        start = time.monotonic()
        grace = min(5.0, self._recover_timeout)
        connected, paid_at, last = False, None, before
        while True:
            now = time.monotonic()
            try:
                if not connected:
                    self._conn = self._open()
                    connected = True
                kept = self._kept_result(digest, before)
                if kept is not None:
                    return self._from_kept(kept, "recovered")
                last = self._last_execution(digest)
                if last > before and paid_at is None:
                    paid_at = now
            except Error as e:
                cause = e.__cause__
                if not (isinstance(cause, adbc_driver_manager.Error) and is_transport(cause)):
                    raise
                connected = False  # the server is unreachable: try again until the deadline
            if paid_at is not None and now - paid_at >= grace:
                return self._from_releases(last, "recovered")
            if now - start > self._recover_timeout or (connected and paid_at is None and now - start > 2.0):
                return None
            time.sleep(0.1)

    def _describe(self, df: pd.DataFrame, charged: bool) -> None:
        """Adds what the releases cost and how they were made to `df.attrs`."""
        ids = [c.get("release") for c in df.attrs.get("curves", []) if c.get("release")]
        ids = [i for i in ids if _RELEASE_ID.match(i)]
        df.attrs.update({"charged": charged, "reused": False, "recovered": False})
        if not ids:
            return
        t = self.arrow(
            "SELECT release, execution, charge, epsilon, delta, parameters FROM dpcurve.releases "
            f"WHERE release IN ({', '.join(_quote(i) for i in ids)})"
        ).to_pylist()
        charges = {r["charge"]: (r["epsilon"], r["delta"]) for r in t}
        df.attrs["epsilon"] = sum(e for e, _ in charges.values())
        df.attrs["delta"] = sum(d for _, d in charges.values())
        executions = sorted({r["execution"] for r in t})
        df.attrs["execution"] = executions[0] if len(executions) == 1 else executions
        params = [json.loads(r["parameters"]) for r in t]
        mechanisms = sorted({p.get("mechanism") for p in params if p.get("mechanism")})
        if mechanisms:
            df.attrs["mechanism"] = mechanisms[0] if len(mechanisms) == 1 else mechanisms
        if len(ids) > 1:
            df.attrs["release"] = ids
