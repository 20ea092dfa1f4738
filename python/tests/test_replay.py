"""The Python example, examples/python/replay.py: it reads every shipped trace format, refuses any other
with a message that names the formats, and its --help describes its arguments."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPLAY = ROOT / "examples" / "python" / "replay.py"


def replay(*args):
    return subprocess.run([sys.executable, str(REPLAY), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("trace", ["azure_conv_head.csv", "azure_code_head.csv",
                                   "burstgpt1_head54.csv", "mooncake_conversation_head.jsonl",
                                   "mooncake_synthetic_head.jsonl"])
def test_every_shipped_trace_format_is_replayed(trace):
    r = replay(ROOT / "data" / trace, "--requests", 20, "--no-timing")
    assert r.returncode == 0, r.stderr
    assert f"replayed 20 requests of {trace}" in r.stdout, r.stdout


def test_a_file_of_another_format_is_refused_with_the_formats_named(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    for path in [other, ROOT / "data" / "README.md"]:
        r = replay(path, "--no-timing")
        assert r.returncode != 0
        assert "Traceback" not in r.stderr, r.stderr
        assert "are none of the formats read: Azure CSV" in r.stderr, r.stderr
        assert "BurstGPT CSV" in r.stderr and "Mooncake JSON lines" in r.stderr, r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 10}\n')
    r = replay(bad, "--no-timing")
    assert r.returncode != 0 and "not a Mooncake record" in r.stderr and "Traceback" not in r.stderr
    r = replay(tmp_path / "missing.csv", "--no-timing")
    assert r.returncode != 0 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_help_describes_every_argument():
    r = replay("--help")
    assert r.returncode == 0
    out = " ".join(r.stdout.split())
    for text in ["Replay a shipped trace slice", "the trace to replay", "Mooncake JSON lines",
                 "replay the trace's first N requests", "skip the schedule() timing"]:
        assert text in out, (text, out)
