"""bench/plot.py renders every figure from the small recorded JSON lines in bench/testdata."""
import os
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = ("throughput", "efficiency", "traffic", "error", "dynamic", "decode")


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def test_every_figure_renders(tmp_path):
    pytest.importorskip("matplotlib")
    data = os.path.join(ROOT, "bench", "testdata")
    files = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".jsonl"))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot.py"), str(tmp_path)]
                          + files + ["--caption", "recorded test data"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in FIGURES:
        path = tmp_path / (name + ".png")
        assert path.exists(), name
        assert path.stat().st_size > 10000, name  # axes, lines and text, not an empty canvas
        width, height = png_size(path)
        assert width > 500 and height > 300, name
    assert sorted(done.stdout.split()) == sorted(str(tmp_path / (n + ".png")) for n in FIGURES)


def test_no_data_is_exit_2(tmp_path):
    pytest.importorskip("matplotlib")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("# a table line, not JSON\n")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot.py"),
                           str(tmp_path / "out"), str(empty)], capture_output=True, text=True)
    assert done.returncode == 2
