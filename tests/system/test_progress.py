import io
import time

from seeder.system.progress import Progress, display_mode, format_seconds


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_there_is_no_bar_only_a_line_with_the_eta_now_and_then(monkeypatch):
    monkeypatch.delenv("SEEDER_PROGRESS", raising=False)
    log = io.StringIO()
    with Progress(10, "embed", "texts", stream=log, every=3600) as bar:
        for _ in range(10):
            bar.update(1)
    assert log.getvalue() == ""  # quiet: nothing within the interval, no bar characters ever
    log = io.StringIO()
    with Progress(4, "embed", "texts", stream=log, every=0) as bar:
        for _ in range(4):
            bar.update(1, loss=0.5)
    lines = log.getvalue().splitlines()
    assert len(lines) == 3  # the last unit is followed by the caller's summary instead
    assert lines[0].startswith("embed: texts 1/4 (25%)  loss 0.5  ETA ") and "\r" not in log.getvalue()


def test_on_a_terminal_a_bar_shows_the_count_and_the_remaining_time(monkeypatch):
    monkeypatch.delenv("SEEDER_PROGRESS", raising=False)
    terminal = Terminal()
    with Progress(5, "epoch 1/3", "batch", stream=terminal) as bar:
        for _ in range(5):
            time.sleep(0.12)  # tqdm redraws at most every 0.1 s
            bar.update(1, loss=0.25)
    shown = terminal.getvalue()
    assert "epoch 1/3" in shown and "4/5" in shown and "loss 0.25" in shown and "<00:00" in shown  # elapsed<remaining


def test_the_environment_switches_progress_off_or_forces_a_mode(monkeypatch):
    monkeypatch.setenv("SEEDER_PROGRESS", "off")
    terminal = Terminal()
    with Progress(3, "x", stream=terminal, every=0) as bar:
        for _ in range(3):
            bar.update(1)
    assert terminal.getvalue() == ""
    monkeypatch.setenv("SEEDER_PROGRESS", "lines")
    assert display_mode(Terminal()) == "lines"


def test_a_bad_progress_setting_is_said_once_and_the_default_used(monkeypatch, capsys):
    """A display setting must not stop a run that has been working for hours."""
    monkeypatch.setenv("SEEDER_PROGRESS", "loud")
    monkeypatch.setenv("SEEDER_PROGRESS_EVERY", "abc")
    assert display_mode(io.StringIO()) == "lines" and display_mode(Terminal()) == "bar"
    log = io.StringIO()
    for _ in range(2):
        with Progress(2, "embed", "texts", stream=log) as bar:
            bar.update(1)
            assert bar.every == 30.0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "seeder: SEEDER_PROGRESS='loud' is not one of auto, bar, lines, off; using auto",
        "seeder: SEEDER_PROGRESS_EVERY='abc' is not a number of seconds >= 0; using 30",
    ]


def test_seconds_are_shown_as_minutes_or_hours():
    assert format_seconds(75.2) == "1m15s" and format_seconds(4000) == "1h06m" and format_seconds(0) == "0m00s"
