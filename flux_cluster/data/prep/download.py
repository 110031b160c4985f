"""download: the MLCommons R2 downloader for the three flux1 datasets, resumable.

The downloader (mlcommons/r2-downloader) fetches with wget and checks MD5 sums; we run it once per
dataset in the source root and mark each finished dataset, so a re-run after a failure skips those.
This stage needs the internet: it cannot run on the machines this project is tested on, where a
stand-in downloader (FLUX_R2_DOWNLOADER) exercises everything around it.
"""

import os
import shutil
import subprocess
from pathlib import Path

from flux_cluster.atomic import write_atomic
from flux_cluster.data.format import EMPTY_DIR, SOURCE_DIRS
from flux_cluster.errors import FluxClusterError

DOWNLOADER_URL = (
    "https://raw.githubusercontent.com/mlcommons/r2-downloader/refs/heads/main/mlc-r2-downloader.sh"
)
METADATA_URL = "https://training.mlcommons-storage.org/metadata/"
DATASETS: dict[str, str] = {
    SOURCE_DIRS["train"]: "flux-1-cc12m-preprocessed.uri",
    SOURCE_DIRS["val"]: "flux-1-coco-preprocessed.uri",
    EMPTY_DIR: "flux-1-empty-encodings.uri",
}
"""Folder the downloader creates -> its MLCommons metadata file."""
DOWNLOADER_ENV = "FLUX_R2_DOWNLOADER"
DONE_DIR = ".flux-prep-download"


def download_commands(source_root: Path, downloader: Path) -> list[list[str]]:
    return [["bash", str(downloader), METADATA_URL + uri] for uri in DATASETS.values()]


def download(source_root: Path) -> list[str]:
    """Download what is not marked finished; returns the datasets fetched by this call."""
    try:
        (source_root / DONE_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FluxClusterError(f"{source_root}: cannot write the download there ({exc.strerror})") from None
    todo = {
        name: uri for name, uri in DATASETS.items() if not (source_root / DONE_DIR / f"{name}.done").exists()
    }
    if not todo:
        return []
    downloader = _downloader(source_root)
    for name, uri in todo.items():
        print(f"download: {name} from {METADATA_URL + uri}", flush=True)
        result = subprocess.run(["bash", str(downloader), METADATA_URL + uri], cwd=source_root, check=False)
        if result.returncode != 0:
            raise FluxClusterError(
                f"download of {name} ({uri}) failed with exit code {result.returncode}; "
                "run the stage again to resume"
            )
        if not (source_root / name).is_dir():
            raise FluxClusterError(
                f"download of {name} ({uri}) finished but {source_root / name} does not exist"
            )
        write_atomic(source_root / DONE_DIR / f"{name}.done", uri + "\n")
    return list(todo)


def _downloader(source_root: Path) -> Path:
    """The downloader script: FLUX_R2_DOWNLOADER if set, else MLCommons' script fetched with curl."""
    if os.environ.get(DOWNLOADER_ENV):
        path = Path(os.environ[DOWNLOADER_ENV])
        if not path.is_file():
            raise FluxClusterError(f"{DOWNLOADER_ENV}={path}: no such file")
        return path
    if shutil.which("curl") is None:
        raise FluxClusterError(
            "the download stage needs curl (to fetch the MLCommons R2 downloader); install it"
        )
    target = source_root / DONE_DIR / "mlc-r2-downloader.sh"
    result = subprocess.run(
        ["curl", "--fail", "--silent", "--show-error", "--location", "--output", str(target), DOWNLOADER_URL],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise FluxClusterError(
            f"could not fetch the MLCommons R2 downloader from {DOWNLOADER_URL}: "
            f"{result.stderr.strip() or 'curl failed'}"
        )
    return target
