"""Progress with an ETA for every step that can run longer than a few seconds.

One display for the whole tool (embedding, preprocessing blocks, training epochs, evaluation):

- on a terminal, a tqdm bar on stderr (rate, elapsed and remaining time);
- anywhere else (a log file, CI, ``ray job submit``, a Ray worker), no bar: one plain line at most every
  ``SEEDER_PROGRESS_EVERY`` seconds (30 by default), so a log shows the ETA of a long step without a bar
  redrawn thousands of times;
- ``SEEDER_PROGRESS=off`` silences both (``bar`` or ``lines`` forces one of them).
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable, TextIO

from tqdm import tqdm

MODES = ("auto", "bar", "lines", "off")
DEFAULT_EVERY_S = 30.0
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    # A display setting must not stop a long run: a bad value is said once, and the default used.
    if message not in _warned:
        _warned.add(message)
        print(f"seeder: {message}", file=sys.stderr, flush=True)


def display_mode(stream: TextIO) -> str:
    """``bar``, ``lines`` or ``off`` for ``stream``, from ``SEEDER_PROGRESS`` (default ``auto``: a bar on
    a terminal, lines elsewhere). An unknown value is reported once and read as ``auto``."""
    setting = os.environ.get("SEEDER_PROGRESS", "auto").strip().lower() or "auto"
    if setting not in MODES:
        _warn_once(f"SEEDER_PROGRESS={setting!r} is not one of {', '.join(MODES)}; using auto")
        setting = "auto"
    if setting != "auto":
        return setting
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


def every_seconds() -> float:
    """Seconds between two progress lines, from ``SEEDER_PROGRESS_EVERY`` (a bad value: reported once,
    the default used)."""
    raw = os.environ.get("SEEDER_PROGRESS_EVERY", "").strip()
    if not raw:
        return DEFAULT_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 0):
        _warn_once(f"SEEDER_PROGRESS_EVERY={raw!r} is not a number of seconds >= 0; using {DEFAULT_EVERY_S:g}")
        return DEFAULT_EVERY_S
    return value


def format_seconds(seconds: float) -> str:
    """``75.2`` -> ``1m15s``; ``4000`` -> ``1h06m``."""
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """Progress of ``total`` units of one step, described by ``desc`` (``"embed"``, ``"epoch 3/16"``).

    ``update(n, **postfix)`` after each piece of work; the postfix (running loss, ...) is shown beside
    the count. ``log`` (a callable taking one line) forces plain lines, for tests and for processes
    whose output is collected elsewhere. Use as a context manager, or call ``close``."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "it",
        *,
        stream: TextIO | None = None,
        every: float | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.total, self.desc, self.unit = int(total), desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.mode = "lines" if log is not None else display_mode(self.stream)
        self.every = every_seconds() if every is None else float(every)
        self.log = log or (lambda line: print(line, file=self.stream, flush=True))
        self.done = 0
        self.start = self.last = time.perf_counter()
        self.bar = None
        if self.mode == "bar":
            self.bar = tqdm(total=self.total, desc=desc, unit=unit, file=self.stream, leave=False, dynamic_ncols=True)

    def eta(self) -> float:
        """Seconds left, from the mean rate so far."""
        elapsed = time.perf_counter() - self.start
        return elapsed / self.done * (self.total - self.done) if self.done else float("nan")

    def line(self, postfix: str = "") -> str:
        percent = 100 * self.done / self.total if self.total else 100.0
        text = f"{self.desc}: {self.unit} {self.done:,}/{self.total:,} ({percent:.0f}%)"
        if postfix:
            text += f"  {postfix}"
        return f"{text}  ETA {format_seconds(self.eta())}"

    def update(self, n: int = 1, **postfix: float | str) -> None:
        self.done += n
        shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in postfix.items())
        if self.bar is not None:
            if shown:
                self.bar.set_postfix_str(shown, refresh=False)
            self.bar.update(n)
            return
        now = time.perf_counter()
        # The last unit is followed by the caller's own summary line, so it gets none here.
        if self.mode == "off" or self.done >= self.total or now - self.last < self.every:
            return
        self.last = now
        self.log(self.line(shown))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
