"""Environment names a system config's ``env`` (and ``secrets``) may not use.

An ``env`` entry is exported at the top of the job script. Were its name one the script itself assigns or
reads, the config would change what the script does (or, in an arithmetic context, make bash run a
command hidden in an array subscript). The script's own names are read from the templates themselves, so
a variable added to a template is reserved without anyone keeping a list; the script keeps them in the
``_fc_`` namespace, and ``FLUX_``/``SLURM_`` are reserved whole.

Names that change how the batch shell or the programs it starts behave are refused too: every variable of
the bash manual's "Shell Variables" list (PATH would pick which ``scontrol`` runs, FUNCNEST=1 ends the
script before ``srun``), the dynamic loader's and glibc's (LD_PRELOAD loads a library into every command,
GCONV_PATH and MALLOC_TRACE the same through iconv and malloc;
glibc's own list of names it ignores in setuid programs), and sbatch/srun's input variables (they
override the job's own options). LANG, LC_* and TMPDIR stay allowed: harmless and often needed. A site
that needs a PATH or library path entry sets ``paths.extra_path``/``paths.extra_library_path``.
"""

import re
from functools import cache

from flux_cluster.resources import templates_dir

RESERVED_PREFIXES = ("_fc_", "FLUX_", "SLURM_")
"""The script's own variables, what the ranks read from it, and Slurm's (set per task by srun)."""

SHELL_PREFIXES = {
    "BASH_": "read or set by bash itself",
    "COMP_": "read or set by bash itself",
    "READLINE_": "read or set by bash itself",
    "LD_": "read by the dynamic loader: it changes what every command of the job script loads",
    "SBATCH_": "read by sbatch: it overrides the job's own options",
    "SRUN_": "read by srun: it overrides the job's own options",
    "SALLOC_": "read by salloc: it overrides the job's own options",
}
"""Prefixes refused whole, with why."""

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

SHELL_MANUAL_VARIABLES = frozenset(
    {
        # the bash manual, "Shell Variables": Bourne shell variables
        *("CDPATH", "HOME", "IFS", "MAIL", "MAILPATH", "OPTARG", "OPTIND", "PATH", "PS1", "PS2"),
        # ... and Bash variables (BASH_*, COMP_*, READLINE_* by prefix; LANG, LC_*, TMPDIR allowed)
        *("BASHOPTS", "BASHPID", "CHILD_MAX", "COLUMNS", "COMPREPLY", "COPROC", "DIRSTACK", "EMACS"),
        *("EXECIGNORE", "FCEDIT", "FIGNORE", "FUNCNAME", "FUNCNEST", "GLOBSORT", "GROUPS", "histchars"),
        *("HISTCONTROL", "HISTFILE", "HISTFILESIZE", "HISTIGNORE", "HISTSIZE", "HISTTIMEFORMAT"),
        *("HOSTFILE", "HOSTNAME", "HOSTTYPE", "IGNOREEOF", "INPUTRC", "INSIDE_EMACS", "LINES"),
        *("MACHTYPE", "MAILCHECK", "MAPFILE", "OPTERR", "OSTYPE", "PIPESTATUS", "PROMPT_DIRTRIM"),
        *("PS0", "PS3", "SHELL", "TIMEFORMAT", "TMOUT"),
    }
)
"""The rest of the bash manual's list (BASH_VARIABLES has the names bash is known to act on)."""

GLIBC_VARIABLES = frozenset(
    {
        # glibc's unsecvars.h (what it drops for setuid programs), TMPDIR aside
        *("GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH"),
        *("NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR", "MALLOC_TRACE"),
    }
)
"""Variables glibc reads in every program: they load code or data from a path, or change resolving."""

RANK_VARIABLES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
"""torch.distributed's rendezvous variables, set per rank from Slurm's (flux_cluster/runtime/dist.py)."""

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
    # the names on the same line, never an option's letters (declare -f) nor the next line's first word
    re.compile(
        rf"\b(?:export|local|unset|readonly|declare|read|printf -v)(?:[ \t]+-\S+)*((?:[ \t]+{_NAME})+)"
    ),
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
    if name in BASH_VARIABLES or name in SHELL_MANUAL_VARIABLES:
        extra = "; use paths.extra_path for PATH entries" if name == "PATH" else ""
        return f"{name} is read or set by bash itself{extra}"
    for prefix, why in SHELL_PREFIXES.items():
        if name.startswith(prefix):
            extra = "; use paths.extra_library_path for library folders" if prefix == "LD_" else ""
            return f"{name} is {why} ({prefix}* are refused){extra}"
    if name in GLIBC_VARIABLES:
        return f"{name} is read by glibc in every command of the job script (it loads from a path)"
    return None
