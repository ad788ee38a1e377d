"""Result objects: tidy tables, summaries, figures, and save/load round trips."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import pytest

import probekit
from probekit.errors import CheckpointError, ProbekitError
from tests.conftest import make_hf, sample_tokens


@pytest.fixture(scope="module")
def results():
    model = probekit.load(make_hf("gpt2", scale=2.0))
    data = sample_tokens()
    return [
        probekit.contributions(model, data),
        probekit.skip_effects(model, data),
        probekit.residual_stats(model, data),
        probekit.gradient_norms(model, data),
        probekit.logit_lens(model, data),
        probekit.layer_swaps(model, data, n_bootstrap=10),
    ]


def test_results_are_tidy_with_summary_and_figure(results):
    for res in results:
        assert len(res.df) > 0 and res.df.columns.is_unique
        assert "value" in res.df.columns
        assert res.df["value"].notna().any()
        assert isinstance(res.summary, dict) and res.summary
        fig = res.figure()
        assert isinstance(fig, go.Figure) and len(fig.data) > 0
        assert fig.layout.title.text
        json.dumps(fig.to_plotly_json(), default=str)  # serialisable for reports
        assert type(res).__name__ in repr(res)


def test_save_load_round_trip(results, tmp_path):
    for res in results:
        path = res.save(tmp_path / f"{res.kind}.json")
        loaded = probekit.Result.load(path)
        assert type(loaded) is type(res)
        assert list(loaded.df.columns) == list(res.df.columns)
        for col in res.df.columns:
            a, b = res.df[col].to_numpy(), loaded.df[col].to_numpy()
            if np.issubdtype(a.dtype, np.number):
                assert np.allclose(a.astype(float), b.astype(float), equal_nan=True), col
            else:
                assert list(a) == list(b), col
        for key, value in res.summary.items():
            if isinstance(value, float) and np.isnan(value):
                assert loaded.summary[key] is None or np.isnan(loaded.summary[key])
            else:
                assert (
                    loaded.summary[key] == pytest.approx(value)
                    if isinstance(value, float)
                    else loaded.summary[key] == value
                )
        assert isinstance(loaded.figure(), go.Figure)
    assert not list(tmp_path.glob(".*tmp"))  # no temporary files left behind


def test_load_rejects_garbage(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read a probekit result"):
        probekit.Result.load(bad)
    bad.write_text(
        json.dumps(
            {
                "kind": "nonsense",
                "summary": {},
                "meta": {},
                "df": {"schema": {"fields": []}, "data": []},
            }
        )
    )
    with pytest.raises(CheckpointError, match="unknown kind"):
        probekit.Result.load(bad)


def test_failed_save_leaves_no_partial_file(results, tmp_path, monkeypatch):
    res = results[0]
    target = tmp_path / "r.json"
    res.save(target)
    original = target.read_text()

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", explode)
    with pytest.raises(ProbekitError, match="disk full"):  # one clear error, not the OSError
        res.save(target)
    assert target.read_text() == original
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def _exact_table():
    import pandas as pd

    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "layer": np.arange(6),
            "value": [0.04096981166747418, np.nan, np.inf, -np.inf, 1e-300, rng.random()],
            "name": ["a", "b", "c", "d", "e", "f"],
            "flag": [True, False, True, True, False, False],
        }
    )


@pytest.mark.parametrize("sidecar", [False, True])
def test_save_load_is_exact(tmp_path, monkeypatch, sidecar):
    """Floats come back bit for bit (repr precision in the JSON, or the .npz sidecar)."""
    import pandas as pd

    import probekit.result as result_module

    monkeypatch.setattr(result_module, "SIDECAR_CELLS", 0 if sidecar else 10**9)
    df = _exact_table()
    path = probekit.Result(df, {"x": 0.04096981166747418}).save(tmp_path / "r.json")
    assert (tmp_path / "r.npz").is_file() == sidecar
    back = probekit.Result.load(path)
    pd.testing.assert_frame_equal(back.df, df, check_exact=True)
    assert back.summary["x"] == 0.04096981166747418


def test_result_shows_a_table_in_jupyter():
    res = probekit.Result(_exact_table(), {"clean_loss": 2.123456, "blocks": float("nan")})
    page = res._repr_html_()
    assert "loss of the unmodified model" in page and "2.123" in page and "n/a" in page
    assert "6 rows" in page and "Result(" in repr(res)


def test_large_tables_get_a_gzipped_csv(tmp_path):
    """A table over SIDECAR_CELLS cells is written as .csv.gz (and no plain .csv), a small one
    as .csv; pandas reads both back to the same table."""
    import pandas as pd

    from probekit.report import write_csv
    from probekit.result import SIDECAR_CELLS, Result

    rows = SIDECAR_CELLS // 2 + 1
    big = Result(pd.DataFrame({"layer": range(rows), "value": [0.5 + i for i in range(rows)]}), {})
    small = Result(big.df.head(3), {})
    assert write_csv(big, tmp_path / "big.csv").name == "big.csv.gz"
    assert not (tmp_path / "big.csv").exists()
    assert write_csv(small, tmp_path / "small.csv").name == "small.csv"
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "big.csv.gz"), big.df)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "small.csv"), small.df)
