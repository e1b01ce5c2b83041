"""dpcurve's Flight SQL server through the Python ADBC driver (run by tests/flight_python.rs).

The Rust test starts `dpcurve serve` on a fresh catalog and passes, in the environment:
DPCURVE_URI, DPCURVE_ALICE (a token with a share of table `mixture`), DPCURVE_BOB (a token
whose share of `mixture` is exhausted), DPCURVE_CAROL (a token with no share at all).
Every check raises on failure; the process exits non-zero then.
"""

import os
import sys
import warnings

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pandas as pd
import pyarrow as pa

URI = os.environ["DPCURVE_URI"]
KDE = (
    "SELECT private_kde(x, bandwidth => 0.05, epsilon => 0.25, delta => 1e-6, "
    "lo => -0.2, hi => 1.2, points => 64) AS kde FROM mixture"
)
ROWS = "SELECT unnest(kde.x) AS x, unnest(kde.density) AS density FROM (" + KDE + ")"


Status = adbc_driver_manager.AdbcStatusCode


def connect(token):
    kwargs = {} if token is None else {"adbc.flight.sql.authorization_header": "Bearer " + token}
    # autocommit=True: dpcurve sessions are read-only (no transactions), and ADBC warns without it.
    return flightsql.connect(URI, db_kwargs=kwargs, autocommit=True)


def expect_error(fn, *needles, status=None, kind=None):
    """Runs fn, which must fail with every needle in its message, ADBC status `status`, and
    the server's `dpcurve-error` kind `kind` (in the error's details)."""
    try:
        fn()
    except adbc_driver_manager.Error as e:
        text = str(e)
        for n in needles:
            assert n in text, f"expected {n!r} in the error, got: {text}"
        if status is not None:
            assert e.status_code == status, f"expected {status}, got {e.status_code} ({type(e).__name__}): {text}"
        if kind is not None:
            details = {(k.decode() if isinstance(k, bytes) else k): v for k, v in (e.details or [])}
            assert details.get("dpcurve-error") == kind.encode(), f"expected kind {kind}, got {e.details}"
        return text
    raise AssertionError(f"expected an error containing {needles}")


def budgets(cur):
    cur.execute("SELECT epsilon_spent, share_epsilon_remaining FROM dpcurve.budgets WHERE table_name = 'mixture'")
    t = cur.fetch_arrow_table()
    return t.column(0)[0].as_py(), t.column(1)[0].as_py()


def basic_credentials():
    # ADBC's username/password: names of every length mod 3 (its Basic header is unpadded base64).
    for pair in os.environ["DPCURVE_BASIC"].split(","):
        name, token = pair.split(":", 1)
        with flightsql.connect(URI, db_kwargs={"username": name, "password": token}) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1 AS one")
            assert cur.fetch_arrow_table().column(0)[0].as_py() == 1, name


def no_autocommit_warning():
    # The README's connect line (autocommit=True) connects without a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with connect(os.environ["DPCURVE_ALICE"]) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1 AS one")
            cur.fetch_arrow_table()


def main():
    basic_credentials()
    no_autocommit_warning()
    # 1. Alice: a private curve into pyarrow and pandas, charged once.
    with connect(os.environ["DPCURVE_ALICE"]) as conn, conn.cursor() as cur:
        spent0, share0 = budgets(cur)
        cur.execute(ROWS)
        df = cur.fetch_df()
        assert isinstance(df, pd.DataFrame) and list(df.columns) == ["x", "density"], df.columns
        assert len(df) == 64, len(df)
        assert abs(df["x"].iloc[0] + 0.2) < 1e-12 and abs(df["x"].iloc[-1] - 1.2) < 1e-12
        # The mixture's density peaks near 0.3 and 0.7: far above its value at the edges.
        mid = df[(df["x"] > 0.2) & (df["x"] < 0.8)]["density"].mean()
        edge = df[(df["x"] < -0.1) | (df["x"] > 1.1)]["density"].abs().mean()
        assert mid > 0.5 and mid > 5 * edge, (mid, edge)
        spent1, share1 = budgets(cur)
        assert abs((spent1 - spent0) - 0.25) < 1e-12, (spent0, spent1)
        assert abs((share0 - share1) - 0.25) < 1e-12, (share0, share1)

        # The whole struct as one Arrow value.
        cur.execute(KDE)
        table = cur.fetch_arrow_table()
        assert table.schema.field("kde").type.num_fields >= 4, table.schema
        release = table.column("kde")[0].as_py()["release"]
        assert release.startswith("r"), release
        # Post-processing of a stored release is free: no charge.
        before = budgets(cur)
        cur.execute(f"SELECT release_eval('{release}', 0.3) AS d")
        assert cur.fetch_arrow_table().column(0)[0].as_py() > 0
        assert budgets(cur) == before

        # A guard refusal: the message says why; nothing charged.
        text = expect_error(lambda: cur.execute("SELECT avg(x) FROM mixture"), "private", status=Status.INVALID_ARGUMENT)
        assert "mixture" in text or "private" in text
        assert budgets(cur) == before
        # Placeholders, bound or not, reach the documented message.
        expect_error(lambda: cur.execute("SELECT ? AS p"), "bound parameters are not supported")
        expect_error(lambda: cur.adbc_prepare("SELECT x FROM mixture WHERE x > ?"), "bound parameters are not supported")
        # An unknown release id is the caller's mistake, not the server's.
        expect_error(
            lambda: cur.execute("SELECT * FROM release('r999')"), "no stored release 'r999'",
            status=Status.INVALID_ARGUMENT,
        )
        assert budgets(cur) == before

        # Metadata: the private table is listed with its columns (public metadata).
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
        names = [t["table_name"] for c in objects for s in c["catalog_db_schemas"] for t in (s["db_schema_tables"] or [])]
        assert "mixture" in names and "budgets" in names, names
        info = conn.adbc_get_info()
        assert info.get("vendor_name") == "dpcurve", info

        # Until the share is exhausted: 0.25 each, the share was 1.0 → 2 more fit, the 3rd is refused.
        cur.execute(KDE)
        cur.fetch_arrow_table()
        cur.execute(KDE)
        cur.fetch_arrow_table()
        spent2, share2 = budgets(cur)
        assert share2 < 0.25, share2

        def over_budget():
            cur.execute(KDE)
            cur.fetch_arrow_table()

        # An exhausted budget or share: ADBC status UNAUTHORIZED (gRPC PermissionDenied), kind budget-exhausted.
        expect_error(
            over_budget, "analyst 'alice' has exhausted their share of table 'mixture'", "nothing was read",
            status=Status.UNAUTHORIZED, kind="budget-exhausted",
        )
        assert budgets(cur) == (spent2, share2), "a refused query was charged"

    # 2. Bob's share is exhausted: refused with his own message.
    with connect(os.environ["DPCURVE_BOB"]) as conn, conn.cursor() as cur:
        def bob():
            cur.execute(KDE)
            cur.fetch_arrow_table()

        expect_error(bob, "analyst 'bob' has exhausted their share of table 'mixture'", status=Status.UNAUTHORIZED, kind="budget-exhausted")

    # 2b. Carol has no share of `mixture` at all: ADBC status UNAUTHORIZED, kind no-share.
    with connect(os.environ["DPCURVE_CAROL"]) as conn, conn.cursor() as cur:
        def carol():
            cur.execute(KDE)
            cur.fetch_arrow_table()

        expect_error(carol, "analyst 'carol' has no share of table 'mixture'", status=Status.UNAUTHORIZED, kind="no-share")

    # 3. Without a token, and with a made-up one: refused before anything runs.
    for token in (None, "dpc1.alice." + "0" * 64):
        def anon():
            with connect(token) as conn, conn.cursor() as cur:
                cur.execute(KDE)
                cur.fetch_arrow_table()

        expect_error(anon, "token", status=Status.UNAUTHENTICATED)

    # 4. Over TLS, trusting the server's self-signed certificate.
    tls_uri, ca = os.environ.get("DPCURVE_TLS_URI"), os.environ.get("DPCURVE_TLS_CA")
    if tls_uri:
        with open(ca) as f:
            pem = f.read()
        kwargs = {
            "adbc.flight.sql.authorization_header": "Bearer " + os.environ["DPCURVE_BOB"],
            "adbc.flight.sql.client_option.tls_root_certs": pem,
        }
        with flightsql.connect(tls_uri, db_kwargs=kwargs) as conn, conn.cursor() as cur:
            cur.execute("SELECT table_name FROM dpcurve.budgets")
            assert cur.fetch_arrow_table().column(0).to_pylist() == ["mixture"]

    print("python client: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"python client: FAILED: {e}", file=sys.stderr)
        raise
