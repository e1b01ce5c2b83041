"""The `dpcurve` Python package against a real `dpcurve serve` (run by tests/python_client.rs).

The Rust test starts the server on a fresh catalog and passes, in the environment: DPCURVE_URI;
DPCURVE_SMALL_URI (the same catalog, served with 100 kB of memory per analyst: no result is kept);
DPCURVE_TLS_URI and DPCURVE_TLS_CA (the same catalog over TLS, its self-signed certificate);
tokens DPCURVE_ALICE (a share of `patients`), DPCURVE_ERIN (another share, for the reuse and
recovery counts), DPCURVE_BOB (a share too small for one query), DPCURVE_CAROL (no share).
`patients` has columns x, y in [-0.2, 1.2], g with declared keys 'a', 'b', 'c', and curves c
(20 points each).
"""

import math
import os
import socket
import threading

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest

import dpcurve

URI = os.environ["DPCURVE_URI"]
KDE = (
    "SELECT private_kde(x, bandwidth => 0.05, epsilon => 0.25, delta => 1e-6, lo => -0.2, hi => 1.2, "
    "points => 64) AS k FROM patients"
)
COST = 0.25


def left(db, table="patients"):
    """What remains of the analyst's ε share of `table`."""
    b = db.budgets()
    row = b[b["table_name"] == table].iloc[0]
    return row["share_epsilon_remaining"]


@pytest.fixture
def alice():
    with dpcurve.connect(URI, token=os.environ["DPCURVE_ALICE"]) as db:
        yield db


def test_curve_is_a_long_dataframe_with_its_bands_and_what_it_cost(alice):
    before = left(alice)
    kde = alice.curve(KDE.replace("delta => 1e-6", "delta => 1e-6, mechanism => 'gaussian'"), reuse=False)
    assert isinstance(kde, pd.DataFrame)
    assert list(kde.columns) == ["x", "density", "noise_band", "band"], kde.columns
    assert len(kde) == 64
    assert kde["x"].iloc[0] == pytest.approx(-0.2) and kde["x"].iloc[-1] == pytest.approx(1.2)
    # The mixture peaks near 0.3 and 0.7, far above the edges; bands are positive half-widths.
    mid = kde[(kde["x"] > 0.2) & (kde["x"] < 0.8)]["density"].mean()
    assert mid > 0.5, mid
    assert (kde["noise_band"] > 0).all() and (kde["band"] >= kde["noise_band"]).all()
    a = kde.attrs
    assert a["release"].startswith("r") and a["charged"] and not a["reused"]
    assert a["mechanism"] == "gaussian" and a["epsilon"] == pytest.approx(COST) and a["delta"] == pytest.approx(1e-6)
    # The smoothing the release applies (binning adds a little to h).
    assert a["bandwidth"] == pytest.approx(0.05, rel=0.01) and a["mass"] > 0
    assert before - left(alice) == pytest.approx(COST)


def test_auto_bandwidth_reports_the_bandwidth_used(alice):
    kde = alice.curve("SELECT private_kde(x, 'auto', 0.5, 0) AS k FROM patients", reuse=False)
    assert kde.attrs["mechanism"] == "laplace" and kde.attrs["delta"] == 0
    assert kde.attrs["bandwidth"] > 0 and math.isfinite(kde.attrs["bandwidth"])


def test_reuse_charges_once_and_reuse_false_pays_again():
    sql = KDE.replace("points => 64", "points => 65")
    with dpcurve.connect(URI, token=os.environ["DPCURVE_ERIN"]) as db:
        s0 = left(db)
        first = db.curve(sql)
        s1 = left(db)
        second = db.curve(sql)
        s2 = left(db)
        assert s0 - s1 == pytest.approx(COST) and s2 == s1, (s0, s1, s2)
        assert not first.attrs["reused"] and second.attrs["reused"] and not second.attrs["charged"]
        assert second.attrs["release"] == first.attrs["release"]
        pd.testing.assert_frame_equal(first, second)
        # The same statement laid out differently is reused; any other change is another statement.
        assert db.curve("  " + sql.replace(", ", ",\n    ") + "\n").attrs["reused"]
        third = db.curve(sql.replace("points => 65", "points => 66"))
        assert not third.attrs["reused"] and left(db) == pytest.approx(s2 - COST)
        fresh = db.curve(sql, reuse=False)
        assert fresh.attrs["charged"] and fresh.attrs["release"] != first.attrs["release"]
        assert left(db) == pytest.approx(s2 - 2 * COST)
        # The next reuse returns the newest kept result.
        assert db.curve(sql).attrs["release"] == fresh.attrs["release"]


def test_grouped_curves_carry_their_keys_and_plot_one_line_per_group(alice):
    kde = alice.curve(
        "SELECT g, private_kde(x, bandwidth => 0.05, epsilon => 0.25, delta => 1e-6, points => 32) AS k "
        "FROM patients GROUP BY g ORDER BY g",
        reuse=False,
    )
    assert list(kde.columns) == ["g", "x", "density", "noise_band", "band"]
    assert sorted(kde["g"].unique()) == ["a", "b", "c"] and len(kde) == 3 * 32
    assert [c["g"] for c in kde.attrs["curves"]] == ["a", "b", "c"]
    assert len(kde.attrs["release"]) == 3 and kde.attrs["epsilon"] == pytest.approx(COST)
    fig = dpcurve.plot(kde)
    assert len(fig.axes[0].get_lines()) == 3


def test_a_2d_density_is_a_grid_and_plots_as_a_heat_map(alice):
    kde = alice.curve(
        "SELECT private_kde2d(x, y, 0.1, 0.1, 0.5, 1e-6, points_x => 8, points_y => 6) AS k FROM patients",
        reuse=False,
    )
    assert list(kde.columns)[:3] == ["x", "y", "density"] and len(kde) == 8 * 6
    assert kde.attrs["surface"] and kde["density"].notna().all()
    fig = dpcurve.plot(kde)
    assert len(fig.axes) == 2  # the heat map and its colour bar
    assert fig.axes[1].get_ylabel() == "density"


@pytest.mark.parametrize(
    "call, columns",
    [
        ("private_cdf(x, epsilon => 0.2, delta => 0, points => 40)", ["x", "cdf", "noise_band", "band"]),
        ("private_quantiles(x, [0.25, 0.5, 0.75], 0.2, 0)", ["p", "quantile", "lower", "upper"]),
        ("private_mean_curve(c, 1.0, 1e-5, clip => 0.5, points => 20)", ["t", "mean", "noise_band"]),
        ("private_kernel_regression(y, x, 0.5, 0, bandwidth => 0.1)", ["x", "fit"]),
    ],
)
def test_every_curve_type_unnests_and_plots(alice, call, columns):
    df = alice.curve(f"SELECT {call} AS r FROM patients", reuse=False)
    assert list(df.columns) == columns, df.columns
    assert len(df) >= 3 and df[columns[1]].notna().all()
    assert df.attrs["release"].startswith("r") and df.attrs["charged"]
    fig = dpcurve.plot(df)
    assert len(fig.axes[0].get_lines()) == 1 and fig.axes[0].get_ylabel() == columns[1]
    if "lower" in columns:
        assert (df["lower"] <= df["quantile"]).all() and (df["quantile"] <= df["upper"]).all()


def test_sql_budgets_releases_and_a_stored_release_free(alice):
    kde = alice.curve(KDE.replace("points => 64", "points => 33"), reuse=False)
    df = alice.sql("SELECT 1 AS one, 'a' AS s")
    assert df.to_dict("records") == [{"one": 1, "s": "a"}]
    raw = alice.sql(KDE.replace("points => 64", "points => 34"))
    assert list(raw.columns) == ["k"] and isinstance(raw["k"].iloc[0], dict)
    budgets = alice.budgets()
    assert "patients" in set(budgets["table_name"])
    releases = alice.releases()
    assert {"release", "execution", "statement_sha256", "epsilon", "delta"} <= set(releases.columns)
    assert kde.attrs["release"] in set(releases["release"])
    before = left(alice)
    again = alice.release(kde.attrs["release"])
    assert left(alice) == before
    pd.testing.assert_series_equal(again["density"], kde["density"])
    assert not again.attrs["charged"]
    # The kept result of the paid execution: free for its analyst, unknown to any other.
    execution = kde.attrs["execution"]
    kept = alice.sql(f"SELECT * FROM stored_result({execution})")
    assert kept["k"].iloc[0]["release"] == kde.attrs["release"] and left(alice) == before
    with dpcurve.connect(URI, token=os.environ["DPCURVE_BOB"]) as bob:
        with pytest.raises(dpcurve.InvalidQuery, match=f"no kept result of execution {execution}"):
            bob.sql(f"SELECT * FROM stored_result({execution})")
        with pytest.raises(dpcurve.InvalidQuery):
            bob.release(kde.attrs["release"])


def test_refusals_are_exceptions_with_their_fields(alice):
    with pytest.raises(dpcurve.Refused) as e:
        alice.sql("SELECT x FROM patients")
    assert e.value.rule == "no-raw-rows", e.value.details
    with pytest.raises(dpcurve.InvalidQuery):
        alice.curve(KDE.replace("bandwidth => 0.05", "bandwidth => -1"))
    with dpcurve.connect(URI, token=os.environ["DPCURVE_BOB"]) as bob:
        with pytest.raises(dpcurve.BudgetExhausted) as e:
            bob.curve(KDE)
        assert e.value.table == "patients" and e.value.scope == "share"
        assert e.value.remaining["epsilon"] == pytest.approx(0.1) and e.value.cost["epsilon"] == pytest.approx(COST)
    with dpcurve.connect(URI, token=os.environ["DPCURVE_CAROL"]) as carol:
        with pytest.raises(dpcurve.NoShare) as e:
            carol.curve(KDE)
        assert e.value.table == "patients"
    with pytest.raises(dpcurve.AuthenticationError):
        dpcurve.connect(URI, token="dpc1.alice." + "0" * 64)
    # Every class is a dpcurve.Error.
    assert issubclass(dpcurve.Refused, dpcurve.Error) and issubclass(dpcurve.BudgetExhausted, dpcurve.Error)


def test_connect_does_not_warn():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with dpcurve.connect(URI, token=os.environ["DPCURVE_ALICE"]) as db:
            db.sql("SELECT 1 AS one")


def test_user_name_and_password_are_the_analyst_and_their_token():
    with dpcurve.connect(URI, username="alice", password=os.environ["DPCURVE_ALICE"]) as db:
        assert "patients" in set(db.budgets()["table_name"])
    with pytest.raises(dpcurve.AuthenticationError):
        dpcurve.connect(URI, username="alice", password=os.environ["DPCURVE_BOB"])


def test_a_paid_result_too_large_to_keep_is_not_paid_again():
    # A server that keeps at most 100 kB per analyst: these results are not kept.
    small = os.environ["DPCURVE_SMALL_URI"]
    grouped = (
        "SELECT g, private_kde(x, bandwidth => 0.05, epsilon => 0.25, delta => 1e-6, points => 2048) AS k "
        "FROM patients GROUP BY g"
    )
    single = KDE.replace("points => 64", "points => 4096")
    with dpcurve.connect(small, token=os.environ["DPCURVE_ERIN"]) as db:
        first = db.curve(grouped, reuse=False)
        assert len(first) == 3 * 2048
        s0 = left(db)
        with pytest.raises(dpcurve.ResultNotKept) as e:
            db.curve(grouped)
        assert sorted(e.value.releases) == sorted(first.attrs["release"])
        assert left(db) == s0, "not paid again"
        # One release is a whole curve: rebuilt from it, free.
        paid = db.curve(single, reuse=False)
        again = db.curve(single)
        assert again.attrs["reused"] and again.attrs["release"] == paid.attrs["release"]
        pd.testing.assert_series_equal(again["density"], paid["density"])
        assert left(db) == pytest.approx(s0 - COST)


def test_tls_with_the_servers_certificate():
    with dpcurve.connect(
        os.environ["DPCURVE_TLS_URI"], token=os.environ["DPCURVE_ALICE"], tls_root_certs=os.environ["DPCURVE_TLS_CA"]
    ) as db:
        assert "patients" in set(db.budgets()["table_name"])


class CuttingProxy:
    """A TCP proxy to the server that cuts its first connection once more than `cut_after` bytes
    came back from the server (later connections pass through)."""

    def __init__(self, target, cut_after):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.cut_after = cut_after
        self.cuts = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.first = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            cut_after, self.first = (self.cut_after if self.first else None), False
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, cut_after), daemon=True).start()

    def _pump(self, src, dst, cut_after):
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if cut_after is not None and sent + len(data) > cut_after:
                    self.cuts += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_a_paid_result_lost_to_a_dropped_connection_is_recovered():
    server = URI.split("://", 1)[1]
    proxy = CuttingProxy(server, cut_after=40_000)
    # 4096 points: the result (≈ 130 kB) is cut mid-stream, after the charge.
    sql = KDE.replace("points => 64", "points => 4096")
    with dpcurve.connect(URI, token=os.environ["DPCURVE_ERIN"]) as direct:
        before = left(direct)
    with dpcurve.connect(f"grpc://127.0.0.1:{proxy.port}", token=os.environ["DPCURVE_ERIN"]) as db:
        kde = db.curve(sql, reuse=False)
        assert proxy.cuts == 1, "the proxy never cut the connection: the test would prove nothing"
        assert kde.attrs["recovered"] and len(kde) == 4096
        assert left(db) == pytest.approx(before - COST), "charged once, recovered free"


def test_a_paid_result_too_large_to_keep_is_recovered_from_its_release():
    # The same cut on the server that keeps no result: rebuilt from the stored release.
    server = os.environ["DPCURVE_SMALL_URI"].split("://", 1)[1]
    proxy = CuttingProxy(server, cut_after=40_000)
    sql = KDE.replace("points => 64", "points => 4095")
    with dpcurve.connect(f"grpc://127.0.0.1:{proxy.port}", token=os.environ["DPCURVE_ERIN"], recover_timeout=3) as db:
        before = left(db)
        kde = db.curve(sql, reuse=False)
        assert proxy.cuts == 1, "the proxy never cut the connection: the test would prove nothing"
        assert kde.attrs["recovered"] and len(kde) == 4095 and kde.attrs["release"].startswith("r")
        assert kde.attrs["column"] == "private_kde", "rebuilt from release(id), not a kept result"
        assert left(db) == pytest.approx(before - COST)
