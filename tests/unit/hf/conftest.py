"""Fixtures of the hf workload's hostile-input tests: the tiny models written once, and a call that must
return within a deadline even where a FIFO would block it forever."""

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bert/, gpt2/ and vit/: the tiny random-init models of `flux-cluster models tiny`."""
    from flux_cluster.models.tiny_hf import write_tiny_hf

    root = tmp_path_factory.mktemp("tiny_hf")
    for kind in ("bert", "gpt2", "vit"):
        write_tiny_hf(root / kind, kind=kind)  # type: ignore[arg-type]
    return root


@pytest.fixture
def within() -> Callable[..., BaseException | None]:
    """within(seconds, call, *fifos): the exception call raises (None if none), failing the test when it
    has not returned after seconds. A call blocked opening one of the FIFOs is released first (a writer
    opens and closes it), so a failing test ends instead of hanging the suite."""

    def run(seconds: float, call: Callable[[], Any], *fifos: Path) -> BaseException | None:
        outcome: list[BaseException | None] = []

        def target() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(seconds)
        if thread.is_alive():
            for fifo in fifos:  # unblock a reader stuck in open(): it reads end-of-file
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(10)
            pytest.fail(f"did not return within {seconds} s (blocked on a FIFO?)")
        return outcome[0]

    return run
