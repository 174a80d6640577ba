"""Rank 0's progress: a bar on a terminal, plain lines elsewhere (a log, a CI log, horovodrun's prefixed pipes)."""
import fcntl
import io
import os
import select
import struct
import termios

from hvdsync.core.telemetry import progress
from hvdsync.core.telemetry.progress import PROGRESS_ENV, PlainProgress, Progress, draws_in_place, progress_display


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_lines_come_every_interval_and_once_at_the_end():
    out, clock = io.StringIO(), Clock()
    bar = PlainProgress(100, "train", out, interval=10.0, clock=clock)
    for step in range(100):
        clock.now += 0.5                       # 2 steps a second: a line every 20 steps
        bar.set_postfix({"loss": f"{1 / (step + 1):.4g}"})
        bar.update()
    bar.close()                                # the last line was printed at 100/100: not again
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split(" ")[1] for line in lines] == ["20/100", "40/100", "60/100", "80/100", "100/100"]
    assert lines[-1] == "train: 100/100 (100%) 50.0 s, 2/s, loss=0.01"


def test_close_before_the_end_prints_where_the_work_stopped():
    out, clock = io.StringIO(), Clock()
    bar = PlainProgress(10, "tensorflow x2", out, interval=10.0, clock=clock)
    bar.update(3)
    bar.close()
    assert out.getvalue() == "tensorflow x2: 3/10 (30%) 0.0 s\n"


def test_a_terminal_gets_a_bar_and_anything_else_plain_lines():
    assert not draws_in_place(io.StringIO())
    assert isinstance(progress_display(5, "train", io.StringIO()), PlainProgress)
    master, slave = os.openpty()                # a real terminal, 80 columns wide (a new pty has 0)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with open(slave, "w") as tty:
        assert draws_in_place(tty)
        bar = progress_display(5, "train", tty)
        assert not isinstance(bar, PlainProgress)
        bar.update(5)
        bar.close()
    drawn = ""
    while select.select([master], [], [], 0.5)[0]:   # all the bar wrote: a pty hands it over in pieces
        try:
            drawn += os.read(master, 4096).decode()
        except OSError:                               # EIO: the terminal's other end is closed and drained
            break
    os.close(master)
    assert "\r" in drawn and "5/5" in drawn     # a bar, redrawn in place


def test_a_worker_under_horovodrun_writes_plain_lines_on_rank_0_only(monkeypatch, capsys):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)   # no hvdsync launcher: the worker shows progress itself
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.0)
    for rank in (1, 0):
        bar = Progress(4, rank, desc="torch x2")
        for _ in range(4):
            bar.update(loss=0.5)
        bar.close()
    err = capsys.readouterr().err                      # pytest's capture is no terminal, as horovodrun's pipe
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) == 4 and lines[-1].startswith("torch x2: 4/4 (100%)") and lines[-1].endswith("loss=0.5")


def test_a_closed_stream_is_not_a_terminal():
    stream = io.StringIO()
    stream.close()
    assert not draws_in_place(stream)


def test_rank_0_on_a_host_without_the_launchers_folder_prints_plain_lines(monkeypatch, capsys, tmp_path):
    # The launcher's progress file lives on the launcher's machine; rank 0 on another host without a shared file
    # system has no such folder: it must train and show plain lines, not fail opening the file.
    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path / "not-on-this-host" / "progress.jsonl"))
    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.0)
    bar = Progress(2, 0, desc="torch x4")
    bar.update()
    bar.update()
    bar.close()
    assert capsys.readouterr().err.splitlines()[-1].startswith("torch x4: 2/2 (100%)")
    assert not (tmp_path / "not-on-this-host").exists()
    here = tmp_path / "progress.jsonl"                  # and where the folder is there, the file gets the records
    monkeypatch.setenv(PROGRESS_ENV, str(here))
    bar = Progress(2, 0, desc="torch x4")
    bar.update()
    bar.close()
    assert here.read_text().splitlines()[0] == '{"total": 2, "desc": "torch x4"}'
