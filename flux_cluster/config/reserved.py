"""Environment names a system config's ``env`` (and ``secrets``) may not use.

An ``env`` entry is exported at the top of the job script. Were its name one the script itself assigns or
reads, the config would change what the script does (or, in an arithmetic context, make bash run a
command hidden in an array subscript). The script's own names are read from the templates themselves, so
a variable added to a template is reserved without anyone keeping a list; the script keeps them in the
``_fc_`` namespace, and ``FLUX_``/``SLURM_`` are reserved whole.
"""

import re
from functools import cache

from flux_cluster.resources import templates_dir

RESERVED_PREFIXES = ("_fc_", "FLUX_", "SLURM_")
"""The script's own variables, what the ranks read from it, and Slurm's (set per task by srun)."""

BASH_VARIABLES = frozenset(
    {
        # read by bash: they change how the script's own commands run, or what it sources
        "BASH_ENV",
        "ENV",
        "IFS",
        "PS4",
        "SHELLOPTS",
        "BASHOPTS",
        "BASH_XTRACEFD",
        "BASH_COMPAT",
        "POSIXLY_CORRECT",
        "GLOBIGNORE",
        "CDPATH",
        "PROMPT_COMMAND",
        # set by bash itself: an exported value would not reach the ranks as written
        "_",
        "BASH",
        "BASHPID",
        "BASH_ARGV0",
        "BASH_COMMAND",
        "BASH_SUBSHELL",
        "BASH_VERSION",
        "EPOCHREALTIME",
        "EPOCHSECONDS",
        "HISTCMD",
        "LINENO",
        "OLDPWD",
        "OPTARG",
        "OPTIND",
        "PPID",
        "PWD",
        "RANDOM",
        "REPLY",
        "SECONDS",
        "SHLVL",
        "SRANDOM",
        "UID",
        "EUID",
    }
)
"""Variables bash itself reads or sets."""

RANK_VARIABLES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
"""torch.distributed's rendezvous variables, set per rank from Slurm's (flux_cluster/dist.py)."""

RUN_SUB_SETTINGS = {
    "NEXP": "--nexp (mlperf.nexp)",
    "SEED_BASE": "--seed (mlperf.seed_base)",
    "DGXNNODES": "nodes",
    "DGXNGPU": "gpus_per_node",
    "WALLTIME_RUNANDTIME": "mlperf.run_minutes",
    "CLEAR_CACHES": "mlperf.clear_caches",
    "CHECK_COMPLIANCE": "mlperf.check_compliance",
    "MLPERF_RULESET": "mlperf.ruleset",
    "DATAROOT": "paths.data_root",
    "CONT": "container.image",
}
"""NVIDIA run.sub/config_<system>.sh settings: in env they would do nothing; the config has a key for each."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)
_COMMENT_LINE = re.compile(r"^\s*#.*$", re.MULTILINE)
_USES = (
    re.compile(rf"\$\{{?[!#]?({_NAME})"),  # $NAME, ${NAME...}, ${!NAME}, ${#NAME}
    re.compile(rf"(?:^|[\s;&|(`])({_NAME})\+?=", re.MULTILINE),  # NAME=..., also after export/local
    re.compile(rf"\b(?:export|local|unset|readonly|declare|read|printf -v)((?:\s+-\S+)*(?:\s+{_NAME})+)"),
    re.compile(rf"\bfor\s+({_NAME})\s+in\b"),
)
_ARITHMETIC = re.compile(r"\(\((.*?)\)\)", re.DOTALL)  # $(( )), (( )), for (( ))
_KEYWORDS = {"export", "local", "unset", "readonly", "declare", "read", "printf"}


def template_names(text: str) -> set[str]:
    """Shell variable names a template's own (non-Jinja, non-comment) text assigns or reads."""
    code = _COMMENT_LINE.sub("", _JINJA.sub(" ", text))
    names: set[str] = set()
    for pattern in _USES:
        for match in pattern.finditer(code):
            names.update(re.findall(_NAME, match.group(1)))
    for match in _ARITHMETIC.finditer(code):
        names.update(n for n in re.findall(rf"(?<![#$\w]){_NAME}", match.group(1)))
    return names - _KEYWORDS


@cache
def script_names() -> frozenset[str]:
    """Every variable name the job script templates use."""
    found: set[str] = set()
    for path in sorted(templates_dir().glob("*.j2")):
        found |= template_names(path.read_text())
    return frozenset(found)


def env_name_problem(name: str) -> str | None:
    """Why name cannot come from a config's env or secrets, or None when it can."""
    if name in RUN_SUB_SETTINGS:
        return f"{name} is run.sub's name for {RUN_SUB_SETTINGS[name]}: set that (in env it does nothing)"
    if name.startswith(RESERVED_PREFIXES) or name.lower().startswith("_fc_"):
        return f"{name} is set by the job script or by Slurm ({'*, '.join(RESERVED_PREFIXES)}* are reserved)"
    if name in script_names() or name in RANK_VARIABLES:
        return f"{name} is set by the job script"
    if name in BASH_VARIABLES:
        return f"{name} is read or set by bash itself"
    return None
