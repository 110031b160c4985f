"""Progress for long stages: a rich bar with samples/s and MB/s on a terminal, a line now and then in logs."""

import time
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _Rates(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        if elapsed <= 0:
            return Text(f"- {self.unit}/s  - MB/s", style="progress.data.speed")
        mb = task.fields.get("nbytes", 0) / 1e6
        return Text(
            f"{task.completed / elapsed:,.1f} {self.unit}/s  {mb / elapsed:,.1f} MB/s",
            style="progress.data.speed",
        )


class StageProgress:
    """Counts samples and bytes of one stage; ``advance`` may be called from the main process only."""

    def __init__(
        self,
        label: str,
        total_samples: int,
        console: Console | None = None,
        interval_s: float = 15.0,
        unit: str = "samples",
    ):
        self.unit = unit
        self.console = console or Console(stderr=True)
        self.label = label
        self.total = total_samples
        self.samples = 0
        self.nbytes = 0
        self._started = time.monotonic()
        self._last_line = self._started
        self._interval = interval_s
        self._progress: Progress | None = None
        if self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:,.0f}/{task.total:,.0f} " + unit),
                _Rates(unit),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,  # the bar goes when done: the summary line below is its one record
            )
            self._task = self._progress.add_task(label, total=total_samples, nbytes=0)

    def __enter__(self) -> "StageProgress":
        if self._progress:
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress:
            self._progress.stop()
        if kind is None:
            self.console.print(self.summary(), soft_wrap=True, highlight=False)

    def advance(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.nbytes += nbytes
        if self._progress:
            self._progress.update(self._task, completed=self.samples, nbytes=self.nbytes)
        elif time.monotonic() - self._last_line >= self._interval:
            self._last_line = time.monotonic()
            self.console.print(self.summary(), soft_wrap=True, highlight=False)

    def summary(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return (
            f"{self.label}: {self.samples:,}/{self.total:,} {self.unit}, "
            f"{self.nbytes / 1e6:,.1f} MB in {elapsed:,.1f} s "
            f"({self.samples / elapsed:,.1f} {self.unit}/s, {self.nbytes / 1e6 / elapsed:,.1f} MB/s)"
        )
