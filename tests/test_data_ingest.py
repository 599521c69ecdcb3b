"""History ingest: the file contract (docs/ARCHITECTURE.md, "History file") and one specific error per user mistake."""

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from optimizer_pipeline.contracts import ContractError, binding_from_dict
from optimizer_pipeline.data.ingest import HistoryError, read_history, validate_history_frame
from optimizer_pipeline.data import ingest
from optimizer_pipeline.data.ingest import CLOCK_SKEW_ALLOWANCE_S

JAN1_2024 = 1704067200.0  # 2024-01-01T00:00:00Z in seconds since the epoch


def _binding(dvs=()):
    return binding_from_dict({
        "id": "t1", "sample_period_s": 5,
        "mvs": [{"tag": "v1", "lo": 0, "hi": 6, "max_move": 0.5}],
        "cvs": [{"tag": "y1", "lo": 0, "hi": 10, "target": 5}, {"tag": "y2", "lo": 0, "hi": 10, "target": 5}],
        "dvs": [{"tag": t} for t in dvs],
        "profile": {"id": "p", "template": "linear_mpc_quadratic@1"},
    })


def _write(tmp_path: Path, text: str, name: str = "history.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


GOOD = ("run_id,timestamp,v1,y1,y2,note\n"
        "r1,0,1.0,2.0,3.0,a\n"
        "r1,5,1.5,2.5,3.5,b\n"
        "r2,100,2.0,3.0,4.0,c\n")


def test_csv_returns_contract_columns_in_binding_order_and_drops_extras(tmp_path):
    frame = read_history(_write(tmp_path, GOOD), _binding())
    assert list(frame.columns) == ["run_id", "timestamp", "v1", "y1", "y2"]
    assert frame["run_id"].tolist() == ["r1", "r1", "r2"]
    assert frame["timestamp"].tolist() == [0.0, 5.0, 100.0]
    np.testing.assert_array_equal(frame[["v1", "y1", "y2"]].to_numpy(),
                                  [[1.0, 2.0, 3.0], [1.5, 2.5, 3.5], [2.0, 3.0, 4.0]])
    assert all(frame[c].dtype == np.float64 for c in ["timestamp", "v1", "y1", "y2"])


def test_parquet_round_trip_equals_csv(tmp_path):
    csv_frame = read_history(_write(tmp_path, GOOD), _binding())
    raw = pd.read_csv(tmp_path / "history.csv")
    for name in ("history.parquet", "history.pq"):
        raw.to_parquet(tmp_path / name)
        pd.testing.assert_frame_equal(read_history(tmp_path / name, _binding()), csv_frame)


@pytest.mark.parametrize("name", ["history.csv", "history.parquet"])
def test_file_over_the_byte_limit_is_refused_before_it_is_read_naming_file_and_limit(tmp_path, name, monkeypatch):
    path = tmp_path / name
    with path.open("wb") as handle:  # sparse: the real limit without writing 256 MiB
        handle.truncate(ingest.MAX_HISTORY_BYTES + 1)
    monkeypatch.setattr(pd, "read_csv", lambda *a, **k: pytest.fail("read_csv called on an oversized file"))
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: pytest.fail("read_parquet called on an oversized file"))
    with pytest.raises(HistoryError, match=rf"^{path}: history file is {ingest.MAX_HISTORY_BYTES + 1} bytes, over the "
                                           rf"limit of {ingest.MAX_HISTORY_BYTES} bytes \(MAX_HISTORY_BYTES, 256 MiB\); "
                                           rf"split it into several files and ingest each$"):
        read_history(path, _binding())


@pytest.mark.parametrize("name", ["history.csv", "history.parquet"])
def test_byte_limit_boundary_a_file_of_exactly_the_limit_is_read(tmp_path, name, monkeypatch):
    path = _write(tmp_path, GOOD)
    if name.endswith(".parquet"):
        pd.read_csv(path).to_parquet(tmp_path / name)
        path = tmp_path / name
    size = path.stat().st_size
    monkeypatch.setattr(ingest, "MAX_HISTORY_BYTES", size)
    assert len(read_history(path, _binding())) == 3
    monkeypatch.setattr(ingest, "MAX_HISTORY_BYTES", size - 1)
    with pytest.raises(HistoryError, match=rf"^{path}: history file is {size} bytes, over the limit of {size - 1} bytes"):
        read_history(path, _binding())


@pytest.mark.parametrize("name", ["history.csv", "history.parquet"])
def test_file_over_the_row_limit_is_refused_naming_file_and_limit(tmp_path, name, monkeypatch):
    # the real limit (2 million rows) is too slow to write here: the same check at 3 rows
    path = _write(tmp_path, GOOD)
    if name.endswith(".parquet"):
        pd.read_csv(path).to_parquet(tmp_path / name)
        path = tmp_path / name
    monkeypatch.setattr(ingest, "MAX_HISTORY_ROWS", 3)
    assert len(read_history(path, _binding())) == 3  # exactly the limit is accepted
    monkeypatch.setattr(ingest, "MAX_HISTORY_ROWS", 2)
    with pytest.raises(HistoryError, match=rf"^{path}: more than 2 data rows, the limit of one history file "
                                           rf"\(MAX_HISTORY_ROWS\); split it into several files and ingest each$"):
        read_history(path, _binding())


def test_history_limits_are_the_ones_the_docs_document():
    page = (Path(__file__).resolve().parents[1] / "docs" / "history.md").read_text()  # "Limits"
    assert (ingest.MAX_HISTORY_BYTES, ingest.MAX_HISTORY_ROWS) == (256 * 1024 * 1024, 2_000_000)
    assert "`MAX_HISTORY_BYTES` 256 MiB" in page and "`MAX_HISTORY_ROWS` 2 000 000" in page


def test_iso_timestamps_with_offsets_become_utc_seconds(tmp_path):
    text = ("run_id,timestamp,v1,y1,y2\n"
            "r1,2024-01-01T00:00:00Z,1,2,3\n"
            "r1,2024-01-01T01:00:05+01:00,1,2,3\n"  # = 00:00:05Z
            "r1,2024-01-01 00:00:10,1,2,3\n")  # no offset: UTC
    frame = read_history(_write(tmp_path, text), _binding())
    assert frame["timestamp"].tolist() == [JAN1_2024, JAN1_2024 + 5, JAN1_2024 + 10]


def test_numeric_seconds_timestamps_are_kept(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,1704067200.5,1,2,3\nr1,1704067205.25,1,2,3\n"
    frame = read_history(_write(tmp_path, text), _binding())
    assert frame["timestamp"].tolist() == [JAN1_2024 + 0.5, JAN1_2024 + 5.25]


def test_parquet_datetime_column_becomes_utc_seconds(tmp_path):
    raw = pd.DataFrame({"run_id": ["r1", "r1"],
                        "timestamp": pd.to_datetime(["2024-01-01T00:00:00", "2024-01-01T00:00:05"]),
                        "v1": [1.0, 1.0], "y1": [2.0, 2.0], "y2": [3.0, 3.0]})
    raw.to_parquet(tmp_path / "h.parquet")
    assert read_history(tmp_path / "h.parquet", _binding())["timestamp"].tolist() == [JAN1_2024, JAN1_2024 + 5]


def test_numeric_run_ids_are_text_and_keep_leading_zeros(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\n007,0,1,2,3\n8,0,1,2,3\n"
    assert read_history(_write(tmp_path, text), _binding())["run_id"].tolist() == ["007", "8"]


def test_interleaved_runs_are_valid_when_each_run_increases(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\nr2,0,1,2,3\nr1,5,1,2,3\nr2,5,1,2,3\n"
    assert len(read_history(_write(tmp_path, text), _binding())) == 4


def test_empty_cells_are_missing_values_not_errors(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,,3\nr1,5,1,2,3\n"
    frame = read_history(_write(tmp_path, text), _binding())
    assert np.isnan(frame["y1"].iloc[0]) and frame["y1"].iloc[1] == 2.0


# --------------------------------------------------------------------------- errors


def test_missing_file_names_the_file(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(HistoryError, match=rf"{path}: history file not found"):
        read_history(path, _binding())


def test_history_error_is_a_contract_error():
    assert issubclass(HistoryError, ContractError)


def test_unknown_suffix_is_rejected(tmp_path):
    with pytest.raises(HistoryError, match=r"history\.xlsx: unknown history file type '\.xlsx'"):
        read_history(_write(tmp_path, GOOD, "history.xlsx"), _binding())


def test_non_utf8_file_is_unreadable(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("run_id,timestamp,v1,y1,y2\nr\xe9,0,1,2,3\n".encode("latin-1"))
    with pytest.raises(HistoryError, match=r"latin\.csv: cannot read history file \(not UTF-8 text\)"):
        read_history(path, _binding())


def test_corrupt_parquet_is_unreadable(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(HistoryError, match=r"broken\.parquet: cannot read Parquet file"):
        read_history(path, _binding())


def test_zero_byte_file_is_empty(tmp_path):
    with pytest.raises(HistoryError, match=r"history\.csv: empty file"):
        read_history(_write(tmp_path, ""), _binding())


def test_header_without_rows_is_empty(tmp_path):
    with pytest.raises(HistoryError, match=r"history\.csv: empty file \(no data rows; at least one run is needed\)"):
        read_history(_write(tmp_path, "run_id,timestamp,v1,y1,y2\n\n"), _binding())


def test_semicolon_delimiter_is_detected(tmp_path):
    text = "run_id;timestamp;v1;y1;y2\nr1;0;1,5;2;3\n"
    with pytest.raises(HistoryError, match=r"history\.csv: the header looks like ';'-delimited .*; use ','"):
        read_history(_write(tmp_path, text), _binding())


def test_tab_delimiter_is_detected(tmp_path):
    text = "run_id\ttimestamp\tv1\ty1\ty2\nr1\t0\t1\t2\t3\n"
    with pytest.raises(HistoryError, match=r"looks like tab-delimited"):
        read_history(_write(tmp_path, text), _binding())


def test_duplicate_columns_are_named_from_the_header(tmp_path):
    text = "run_id,timestamp,v1,y1,y2,y1\nr1,0,1,2,3,4\n"
    with pytest.raises(HistoryError, match=r"history\.csv: duplicate column\(s\) 'y1' in the header"):
        read_history(_write(tmp_path, text), _binding())


def test_duplicate_columns_in_a_frame_are_named():
    frame = pd.DataFrame([["r1", 0, 1, 2, 3, 4]], columns=["run_id", "timestamp", "v1", "y1", "y2", "v1"])
    with pytest.raises(HistoryError, match=r"stored: duplicate column\(s\) 'v1'"):
        validate_history_frame(frame, _binding(), "stored")


def test_every_missing_column_is_named(tmp_path):
    text = "run_id,v1,y2,extra\nr1,1,3,x\n"
    with pytest.raises(HistoryError, match=r"history\.csv: missing required column\(s\) 'timestamp', 'y1', 'f1'"):
        read_history(_write(tmp_path, text), _binding(dvs=["f1"]))


def test_a_missing_column_names_the_extra_column_it_was_likely_meant_to_be_in_files_and_frames(tmp_path):
    text = "run_id,Timestamp,v1,y_1,y2\nr1,0,1,2,3\n"
    message = (r"missing required column\(s\) 'timestamp' \(the file has 'Timestamp': column names are case-sensitive\), "
               r"'y1' \(did you mean 'y_1'\?\)$")
    with pytest.raises(HistoryError, match=r"history\.csv: " + message):
        read_history(_write(tmp_path, text), _binding())
    frame = pd.read_csv(_write(tmp_path, text))
    frame.to_parquet(tmp_path / "history.parquet")
    with pytest.raises(HistoryError, match=r"history\.parquet: " + message):
        read_history(tmp_path / "history.parquet", _binding())
    with pytest.raises(HistoryError, match=r"stored: " + message):
        validate_history_frame(frame, _binding(), "stored")


def test_non_numeric_value_names_column_run_row_line_and_value(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\nr1,5,1,2,3\nr2,0,1,2,3\nr2,5,1,2.0.1,3\n"
    with pytest.raises(HistoryError, match=r"history\.csv: column 'y1': non-numeric value '2\.0\.1' "
                                           r"in run 'r2' at row 4 \(line 5\)"):
        read_history(_write(tmp_path, text), _binding())


def test_blank_lines_keep_row_and_line_numbers_true_to_the_file(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\n\nr1,5,1,oops,3\n"
    with pytest.raises(HistoryError, match=r"at row 3 \(line 4\)"):
        read_history(_write(tmp_path, text), _binding())


def test_all_nan_tag_is_named(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,2,\nr1,5,1,2,NaN\n"
    with pytest.raises(HistoryError, match=r"history\.csv: column 'y2' has no values"):
        read_history(_write(tmp_path, text), _binding())


def test_unparseable_timestamp_names_run_row_and_value(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,2024-01-01T00:00:00Z,1,2,3\nr1,yesterday,1,2,3\n"
    with pytest.raises(HistoryError, match=r"history\.csv: run 'r1': timestamp 'yesterday' at row 2 \(line 3\) "
                                           r"is not ISO 8601"):
        read_history(_write(tmp_path, text), _binding())


def test_empty_timestamp_names_the_row(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\nr1,,1,2,3\n"
    with pytest.raises(HistoryError, match=r"run 'r1': timestamp is empty at row 2 \(line 3\)"):
        read_history(_write(tmp_path, text), _binding())


def test_repeated_timestamp_in_a_run_names_run_and_row(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\nr2,0,1,2,3\nr2,5,1,2,3\nr2,5,1,2,3\n"
    with pytest.raises(HistoryError, match=r"history\.csv: run 'r2': timestamp at row 4 \(line 5\) is not after "
                                           r"the previous sample of the run"):
        read_history(_write(tmp_path, text), _binding())


def test_decreasing_timestamp_in_a_run_is_rejected(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,10,1,2,3\nr1,5,1,2,3\n"
    with pytest.raises(HistoryError, match=r"run 'r1': timestamp at row 2 \(line 3\) is not after"):
        read_history(_write(tmp_path, text), _binding())


@pytest.mark.parametrize("cell, shown", [("inf", "inf"), ("-inf", "-inf"), ("Infinity", "inf")])
def test_infinite_value_names_file_column_run_and_first_row(tmp_path, cell, shown):
    text = f"run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\nr1,5,{cell},2,3\nr1,10,{cell},2,3\n"
    with pytest.raises(HistoryError, match=rf"^{tmp_path}/history\.csv: column 'v1': infinite value {shown} in run "
                                           rf"'r1' at row 2 \(line 3\) \(inf / -inf are refused"):
        read_history(_write(tmp_path, text), _binding())


def test_infinite_value_in_parquet_and_frames_is_refused_too(tmp_path):
    frame = pd.DataFrame({"run_id": ["a", "a", "a"], "timestamp": [0.0, 5.0, 10.0], "v1": [1.0, 1.0, 1.0],
                          "y1": [1.0, 1.0, 1.0], "y2": [1.0, np.nan, -np.inf]})
    frame.to_parquet(tmp_path / "h.parquet")
    with pytest.raises(HistoryError, match=r"h\.parquet: column 'y2': infinite value -inf in run 'a' at row 3 "):
        read_history(tmp_path / "h.parquet", _binding())
    with pytest.raises(HistoryError, match=r"^stored: column 'y2': infinite value -inf in run 'a' at row 3 "):
        validate_history_frame(frame, _binding(), "stored")


def test_nan_stays_a_missing_value_beside_the_infinity_rule(tmp_path):
    frame = read_history(_write(tmp_path, "run_id,timestamp,v1,y1,y2\nr1,0,1,NaN,3\nr1,5,1,2,3\n"), _binding())
    assert np.isnan(frame["y1"].iloc[0])


def test_future_timestamp_beyond_the_clock_skew_allowance_names_run_and_first_row(tmp_path):
    now = time.time()
    late = now + CLOCK_SKEW_ALLOWANCE_S + 3600
    text = (f"run_id,timestamp,v1,y1,y2\nr1,{now - 10},1,2,3\nr2,{now - 5},1,2,3\n"
            f"r2,{late},1,2,3\nr2,{late + 5},1,2,3\n")
    path = _write(tmp_path, text)
    with pytest.raises(HistoryError, match=r"history\.csv: run 'r2': timestamp \d{4}-.* at row 3 \(line 4\) is in "
                                           r"the future \(more than 300 s after this host's clock"):
        read_history(path, _binding(), now_s=now)
    assert len(read_history(path, _binding())) == 4  # without a clock (an outcome file) nothing is in the future


def test_clock_skew_allowance_boundary_exactly_the_allowance_ahead_is_accepted(tmp_path):
    now = 1_800_000_000.0
    text = f"run_id,timestamp,v1,y1,y2\nr1,{now - 5},1,2,3\nr1,{now + CLOCK_SKEW_ALLOWANCE_S},1,2,3\n"
    assert len(read_history(_write(tmp_path, text), _binding(), now_s=now)) == 2
    with pytest.raises(HistoryError, match=r"timestamp 2027-01-15T08:05:00\.500000\+00:00 at row 2 \(line 3\) is in "
                                           r"the future \(more than 300 s after this host's clock, 2027-01-15T08:00:00"):
        read_history(_write(tmp_path, text.replace(f"{now + CLOCK_SKEW_ALLOWANCE_S}",
                                                   f"{now + CLOCK_SKEW_ALLOWANCE_S + 0.5}")), _binding(), now_s=now)


def test_empty_run_id_names_the_row(tmp_path):
    text = "run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\n,5,1,2,3\n"
    with pytest.raises(HistoryError, match=r"history\.csv: column 'run_id' is empty at row 2 \(line 3\)"):
        read_history(_write(tmp_path, text), _binding())


def test_frame_errors_give_rows_without_lines():
    frame = pd.DataFrame({"run_id": ["a", "a"], "timestamp": [0.0, 5.0], "v1": [1.0, "x"], "y1": [1.0, 1.0],
                          "y2": [1.0, 1.0]})
    with pytest.raises(HistoryError, match=r"^observed\.csv: column 'v1': non-numeric value 'x' in run 'a' at row 2$"):
        validate_history_frame(frame, _binding(), "observed.csv")


def test_frame_validation_returns_the_same_shape_as_files():
    frame = pd.DataFrame({"y2": [3.0], "y1": [2.0], "v1": [1], "timestamp": ["2024-01-01T00:00:00Z"], "run_id": [7]},
                         index=[42])
    result = validate_history_frame(frame, _binding(), "stored")
    assert list(result.columns) == ["run_id", "timestamp", "v1", "y1", "y2"]
    assert result.iloc[0].tolist() == ["7", JAN1_2024, 1.0, 2.0, 3.0]


def test_extra_columns_are_ignored_also_when_repeated_or_blank(tmp_path):
    """A spreadsheet export's repeated note columns or trailing empty ones are not the binding's:
    ignored like any extra column; a required column twice is still refused."""
    text = "run_id,timestamp,v1,note,y1,y2,note,,\nr1,0,1,a,2,3,b,,\nr1,5,1.5,c,2.5,3.5,d,,\n"
    frame = read_history(_write(tmp_path, text), _binding())
    assert list(frame.columns) == ["run_id", "timestamp", "v1", "y1", "y2"]
    assert frame["y2"].tolist() == [3.0, 3.5]
    stored = pd.DataFrame([["r1", 0, 1, 2, 3, "a", "b"]], columns=["run_id", "timestamp", "v1", "y1", "y2", "x", "x"])
    assert list(validate_history_frame(stored, _binding(), "stored").columns) == ["run_id", "timestamp", "v1", "y1",
                                                                                   "y2"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "history.parquet"  # pandas refuses to write repeated names; pyarrow writes them
    pq.write_table(pa.table([pa.array(["r1", "r1"]), pa.array([0.0, 5.0]), pa.array([1.0, 1.5]), pa.array(["a", "b"]),
                             pa.array([2.0, 2.5]), pa.array([3.0, 3.5]), pa.array(["c", "d"]), pa.array([None, None])],
                            names=["run_id", "timestamp", "v1", "note", "y1", "y2", "note", ""]), path)
    frame = read_history(path, _binding())
    assert list(frame.columns) == ["run_id", "timestamp", "v1", "y1", "y2"] and frame["y2"].tolist() == [3.0, 3.5]
    pq.write_table(pa.table([pa.array(["r1"]), pa.array([0.0]), pa.array([1.0]), pa.array([2.0]), pa.array([3.0]),
                             pa.array([4.0])], names=["run_id", "timestamp", "v1", "y1", "y2", "y1"]), path)
    with pytest.raises(HistoryError, match=r"history\.parquet: duplicate column\(s\) 'y1'"):
        read_history(path, _binding())


PLAIN_FILES = {
    "good": GOOD,
    "bom, CRLF, quotes, spaces after commas": ("\ufeffrun_id, timestamp,v1,y1,y2\r\n\"r1\", 0, 1.0,\"2.0\",3\r\n"
                                               "r1,5,1e-3,-.5,+2.5E+1\r\n"),
    "missing cells, extra columns repeated": "x,run_id,timestamp,v1,y1,y2,x\n1,r1,0,,2,3,2\n1,r1,5,1,,3,2\n",
    "random values": "run_id,timestamp,v1,y1,y2\n" + "".join(
        f"r{k % 3},{JAN1_2024 + 5 * k!r},{float(v)!r},{float(w)!r},{float(z)!r}\n"
        for k, (v, w, z) in enumerate(np.random.default_rng(7).normal(size=(400, 3)) * 10.0 ** np.arange(-3, 6, 3))),
}
NOT_PLAIN_FILES = {  # pandas reads these: the same frame, or the same refusal
    "ISO timestamps": "run_id,timestamp,v1,y1,y2\nr1,2024-01-01T00:00:00Z,1,2,3\nr1,2024-01-01T00:00:05Z,1,2,3\n",
    "NaN text": "run_id,timestamp,v1,y1,y2\nr1,0,nan,2,3\nr1,5,1,2,3\n",
    "blank line": "run_id,timestamp,v1,y1,y2\nr1,0,1,2,3\n\nr1,5,1,2,3\n",
    "underscore in a number": "run_id,timestamp,v1,y1,y2\nr1,0,1_000,2,3\n",
    "short row": "run_id,timestamp,v1,y1,y2\nr1,0,1,2\n",
    "time going back": "run_id,timestamp,v1,y1,y2\nr1,5,1,2,3\nr1,0,1,2,3\n",
    "empty run id": "run_id,timestamp,v1,y1,y2\n ,0,1,2,3\n",
    "infinite value": "run_id,timestamp,v1,y1,y2\nr1,0,1e999,2,3\n",
    "a tag without values": "run_id,timestamp,v1,y1,y2\nr1,0,,2,3\n",
    "duplicate column": "run_id,timestamp,v1,y1,y2,y1\nr1,0,1,2,3,4\n",
}


@pytest.mark.parametrize("name", sorted(PLAIN_FILES) + sorted(NOT_PLAIN_FILES))
def test_a_small_csv_file_reads_as_pandas_reads_it(tmp_path, name, monkeypatch):
    """Small files are read without pandas when every cell is plain (ingest._read_plain_csv: the live
    service's one-period inbox files): the same frame, or the same refusal, as the pandas reader."""
    path = _write(tmp_path, {**PLAIN_FILES, **NOT_PLAIN_FILES}[name])
    plain = ingest._read_plain_csv(path, _binding(), None, True)

    def read():
        try:
            return read_history(path, _binding())
        except HistoryError as exc:
            return str(exc)
    got = read()
    monkeypatch.setattr(ingest, "PLAIN_CSV_BYTES", -1)  # every file through pandas
    expected = read()
    assert (plain is not None) == (name in PLAIN_FILES)
    if isinstance(expected, str):
        assert got == expected
    else:
        pd.testing.assert_frame_equal(got, expected, check_exact=True)


def test_a_plain_csv_file_from_the_future_or_outside_a_transform_is_refused_by_the_pandas_reader(tmp_path):
    future = _write(tmp_path, f"run_id,timestamp,v1,y1,y2\nr1,{time.time() + 2 * CLOCK_SKEW_ALLOWANCE_S},1,2,3\n")
    with pytest.raises(HistoryError, match="in the future"):
        read_history(future, _binding(), now_s=time.time())
    assert ingest._read_plain_csv(future, _binding(), time.time(), True) is None
    spec = binding_from_dict({**_binding().to_dict(), "cvs": [
        {"tag": "y1", "lo": 0.1, "hi": 0.9, "target": 0.5, "transform": {"kind": "logit", "lo": 0, "hi": 1}},
        {"tag": "y2", "lo": 0, "hi": 10, "target": 5}]})
    outside = _write(tmp_path, "run_id,timestamp,v1,y1,y2\nr1,0,1,1.5,3\n")
    with pytest.raises(HistoryError, match="not inside the limits of the CV's transform"):
        read_history(outside, spec)
    assert ingest._read_plain_csv(outside, spec, None, True) is None
    assert ingest._read_plain_csv(outside, spec, None, False) is not None
