"""Secrets (``secrets: [HF_TOKEN]``) reach Slurm jobs through a private folder, never through Slurm.

sbatch's default ``--export=ALL`` would hand every variable of the submitting shell to slurmctld, which
keeps the job's environment in its saved state (and, with ``AccountingStoreFlags=job_env``, in the
accounting database). So the job script's ``#SBATCH --export=ALL,HF_TOKEN=`` blanks each secret there,
and the script reads its value at run time from ``<folder>/HF_TOKEN`` (mode 0600, folder 0700), which
submission writes from the submitting environment. The folder must be one the compute nodes see (the
home directory on clusters): ``$FLUX_CLUSTER_SECRETS``, else ``~/.config/flux-cluster/secrets``; the job
script computes the same default (slurm/templates/_common.sh.j2).
"""

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from flux_cluster.atomic import write_atomic
from flux_cluster.errors import FluxClusterError

SECRETS_ENV = "FLUX_CLUSTER_SECRETS"


def secrets_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(SECRETS_ENV):
        return Path(environ[SECRETS_ENV])
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".config" / "flux-cluster" / "secrets"


def store_secrets(
    names: Iterable[str], environ: Mapping[str, str] | None = None, folder: Path | None = None
) -> list[str]:
    """Write each secret set (non-empty) in environ to folder/NAME, readable by this user only; returns
    the names written. A secret not set keeps the file an earlier submission wrote, if any."""
    environ = os.environ if environ is None else environ
    folder = secrets_dir(environ) if folder is None else folder
    written = [name for name in names if environ.get(name)]
    if not written:
        return []
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)  # also an existing folder: no one else may list or read it
        for name in written:
            # surrogateescape: the exact bytes of the submitting environment
            write_atomic(folder / name, environ[name].encode("utf-8", "surrogateescape"), mode=0o600)
    except OSError as exc:
        raise FluxClusterError(
            f"{folder}: cannot write the secrets {', '.join(written)}: {exc.strerror} "
            f"(set {SECRETS_ENV} to a private folder the compute nodes see)"
        ) from None
    return written
