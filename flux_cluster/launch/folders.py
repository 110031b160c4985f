"""The folders a submission makes on this host before sbatch (its run folder's parents; the mount sources,
which Pyxis and docker need to exist), and their removal when no job started: a refused submission leaves
the file system as it found it."""

from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from flux_cluster.errors import FluxClusterError


def make_folders(paths: Iterable[Path]) -> list[Path]:
    """mkdir -p each path; returns the folders this call made, each before those inside it (what
    remove_made takes). A folder that cannot be made is one line; what was made for it goes again."""
    made: list[Path] = []
    for path in paths:
        missing, new = path.absolute(), []
        while not missing.exists() and not missing.is_symlink():  # a dangling link: mkdir says why
            new.append(missing)
            missing = missing.parent
        made += reversed(new)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            remove_made(made)
            raise FluxClusterError(f"{path}: cannot create the folder: {exc.strerror or exc}") from None
    return made


def remove_made(made: Iterable[Path]) -> None:
    """Remove folders make_folders made, innermost first, each only while empty (rmdir: never what a job
    or anyone else has put in one since)."""
    for folder in reversed(list(made)):
        with suppress(OSError):
            folder.rmdir()
