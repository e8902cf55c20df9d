"""`eagletree bench` output: break-even τ, the markdown table, the JSON file, the progress bar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from eagletree.app.bench.device_gaps import DeviceGaps
from eagletree.app.bench.progress import ProgressBar
from eagletree.app.bench.report import render_markdown, report_json, write_report
from eagletree.app.bench.rows import BenchRow, FirstRequestRow, HFRow, with_break_even

ROWS = [
    BenchRow("plain", 1, 30.3, 30.0, 1.0, 1512, 7.5),
    BenchRow("plain", 8, 132.0, 60.0, 1.0, 1512, 7.3),
    BenchRow("tree S5 k4 N8", 1, 18.8, 45.0, 1.0, 2240, 11.19),
    BenchRow("tree S5 k4 N8", 8, 150.0, 48.0, 1.0, 2100, 12.0),
    BenchRow("chain S3", 32, 600.0, 43.2, 1.0, 1886, 11.09),  # no plain row at bs 32
]


def test_break_even_is_the_step_time_over_plain_at_the_same_batch_size() -> None:
    rows = with_break_even(ROWS)
    assert [r.break_even for r in rows] == [None, None, 45.0 / 30.0, 48.0 / 60.0, None]
    assert [r.speedup for r in rows] == [None, None, 18.8 / 30.3, 150.0 / 132.0, None]
    assert rows[0].device_busy == pytest.approx(7.5 / 30.0)


def test_markdown_has_a_header_the_columns_and_one_line_per_row() -> None:
    text = render_markdown("eagletree bench: H200", with_break_even(ROWS))
    lines = text.splitlines()
    assert lines[0] == "eagletree bench: H200"
    assert lines[2].split("|")[1:-1] == [
        " config ",
        " bs ",
        " tok/s ",
        " ÷ plain ",
        " ms/step ",
        " worst ÷ median step ",
        " tokens/step ",
        " kernels/step ",
        " GPU ms/step ",
        " GPU busy ",
        " break-even τ ",
    ]
    body = [line.split(" | ") for line in lines[4:]]
    assert len(body) == len(ROWS)
    assert body[0] == [
        "| plain", "1", "30.3", "—", "30.0", "n/a", "1.00", "1512", "7.50", "25%", "— |"
    ]  # fmt: skip
    assert body[2][0] == "| tree S5 k4 N8" and body[2][-1] == "1.50 |"
    assert body[2][3] == "0.62"  # 18.8 ÷ 30.3 tok/s
    assert body[3][-1] == "0.80 |"
    assert body[4][-1] == "n/a |"  # speculative without a plain twin


def test_rows_whose_requests_ended_early_say_so_under_the_table() -> None:
    ended = BenchRow("plain", 32, 500.0, 2.0, 1.0, num_ended_early=3, ended_early_reason="eos")
    lines = render_markdown("cpu", [ROWS[0], ended], cuda=False).splitlines()
    assert lines[-1] == (
        "`plain` at bs 32: 3 request(s) ended early (eos) while measured; the later steps ran "
        "a smaller batch."
    )
    assert "ended early" not in render_markdown("cpu", ROWS, cuda=False)


def test_on_the_cpu_the_launch_column_counts_aten_ops_and_device_time_is_absent() -> None:
    rows = [BenchRow("plain", 1, 500.0, 2.0, 1.0, 590, None)]
    lines = render_markdown("cpu", rows, cuda=False).splitlines()
    assert "aten ops/step" in lines[2] and "kernels/step" not in lines[2]
    assert lines[4] == "| plain | 1 | 500 | — | 2.0 | n/a | 1.00 | 590 | n/a | n/a | — |"


def test_the_transformers_table_says_whether_the_tokens_match() -> None:
    hf = [HFRow(1, 13.0, 76.9, 1.0), HFRow(8, 90.0, 88.9, 0.25)]
    text = render_markdown("h", ROWS[:1], hf)
    assert "| 1 | 13.0 | 76.9 | yes |" in text
    assert "| 8 | 90.0 | 88.9 | no (25% before divergence) |" in text


def test_the_report_is_written_as_markdown_and_json(tmp_path: Path) -> None:
    rows = with_break_even(ROWS)
    data = report_json({"device": "H200"}, rows, [HFRow(1, 13.0, 76.9, 1.0)], {"seed": 0})
    md, js = write_report(tmp_path / "sub" / "run.md", "table\n", data)
    assert (md.name, js.name) == ("run.md", "run.json")
    assert md.read_text() == "table\n"
    loaded = json.loads(js.read_text())
    assert loaded["device"] == "H200" and loaded["settings"] == {"seed": 0}
    assert [r["config"] for r in loaded["rows"]] == [r.config for r in rows]
    assert loaded["rows"][2]["break_even"] == pytest.approx(1.5)
    assert loaded["rows"][0]["device_busy"] == pytest.approx(0.25)
    assert loaded["hf"][0]["same_tokens"] is True


def test_the_progress_bar_writes_one_finished_line_when_not_on_a_terminal() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, "plain bs 1", total=4)
    for done in range(1, 6):
        bar.update(done)
    bar.close("30 tok/s")
    assert stream.getvalue() == "plain bs 1 [########################] 4/4 tokens  30 tok/s\n"


def test_the_progress_bar_redraws_its_line_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = ProgressBar(stream, "tree", total=4)
    bar.update(2)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\rtree [############------------] 2/4 tokens\033[K")
    assert text.endswith("\n") and text.count("\n") == 1


def test_the_breakdown_lists_each_row_s_costliest_kernels_only_when_asked() -> None:
    kernels = (("gemm_kernel", 385.0, 4.5), ("merge", 32.0, 0.02))
    rows = [BenchRow("plain", 1, 30.3, 30.0, 1.0, 1512, 7.5, top_kernels=kernels)]
    assert "Costliest" not in render_markdown("h", rows)
    text = render_markdown("h", rows, breakdown=True)
    assert "Costliest kernels of `plain` at bs 1:" in text
    assert "| `gemm_kernel` | 385 | 4.500 |" in text.splitlines()
    assert "| `merge` | 32 | 0.020 |" in text.splitlines()


def test_the_breakdown_says_where_the_device_sat_idle() -> None:
    gaps = DeviceGaps(0.412, 600.0, 0.105, 3.0, (("Memcpy DtoH", 0.06), ("k", 0.02)))
    row = BenchRow("plain", 1, 200.0, 5.0, 1.0, 600, 4.5, top_kernels=(("k", 600, 4.5),),
                   gaps=gaps)  # fmt: skip
    text = render_markdown("h", [row], breakdown=True)
    (line,) = [line for line in text.splitlines() if line.startswith("Device idle")]
    assert "0.412 ms in 600 gaps" in line and "0.105 ms in 3.0 longer waits" in line
    assert "`Memcpy DtoH` 0.060 ms, `k` 0.020 ms" in line
    assert "Device idle" not in render_markdown("h", [row])  # only with the breakdown


def test_the_spread_column_is_the_longest_timed_step_over_the_median_one() -> None:
    steps = (2.0, 2.2, 1.8, 2.0, 7.0)  # one step of 3.5 medians
    row = BenchRow("plain", 1, 500.0, 3.0, 1.0, step_ms=steps)
    assert row.worst_over_median == pytest.approx(7.0 / 2.0)
    assert BenchRow("plain", 1, 500.0, 3.0, 1.0).worst_over_median is None  # not measured
    line = render_markdown("cpu", [row], cuda=False).splitlines()[4]
    assert line.split(" | ")[5] == "3.50"
    data = report_json({}, [row], [], {})
    assert data["rows"][0]["worst_over_median"] == pytest.approx(3.5)
    assert data["rows"][0]["step_ms"] == steps


def test_the_first_requests_table_sets_each_cold_request_against_the_warm_one() -> None:
    rows = [FirstRequestRow("plain", 900.0, 30.0), FirstRequestRow("tree S5 k4 N8", 45.0, 45.0)]
    lines = render_markdown("h", ROWS[:1], first_requests=rows).splitlines()
    table = lines[lines.index("| config | cold ms | warm ms | cold ÷ warm |") :]
    assert table[2:] == ["| plain | 900 | 30.0 | 30.00 |", "| tree S5 k4 N8 | 45.0 | 45.0 | 1.00 |"]
    assert "cold ms" not in render_markdown("h", ROWS[:1])  # none measured: no table
    data = report_json({}, [], [], {}, rows)
    assert [f["cold_over_warm"] for f in data["first_requests"]] == [30.0, 1.0]


def test_rows_whose_long_steps_took_a_twentieth_of_their_time_are_named_under_the_table() -> None:
    stalled = BenchRow("plain", 8, 500.0, 3.0, 1.0, temperature=1.0,
                       step_ms=(2.0, 2.0, 2.0, 2.0, 7.0, 7.0))  # fmt: skip
    calm = BenchRow("chain S3", 8, 900.0, 3.0, 3.0, step_ms=(2.0,) * 40 + (6.5,))
    # the median step 2: the two of 7 ms are over 3 of them, 14 of the row's 22 ms
    assert stalled.stalled_share == pytest.approx(14.0 / 22.0)
    assert calm.stalled_share == pytest.approx(6.5 / 86.5)
    calmer = BenchRow("chain S3", 8, 900.0, 3.0, 3.0, step_ms=(2.0,) * 200 + (6.5,))
    assert BenchRow("plain", 1, 500.0, 3.0, 1.0).stalled_share is None  # not measured
    text = render_markdown("h", [stalled, calm, calmer])
    (line,) = [line for line in text.splitlines() if line.startswith("Steps over 3 ×")]
    assert "`plain` bs 8 T 1 64%, `chain S3` bs 8 8% (a host" in line
    assert render_markdown("h", [calmer]).count("Steps over 3 ×") == 0  # 1.6 %: not named
    assert report_json({}, [stalled], [], {})["rows"][0]["stalled_share"] == pytest.approx(
        14.0 / 22.0
    )
