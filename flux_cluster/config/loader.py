"""Load a system: find its YAML, follow ``extends``, expand ``${VAR}``, apply ``--set``, validate.

Every leaf value remembers where it came from (a file, an environment variable, ``--set`` or the
schema default) so ``flux-cluster systems show`` can explain the resolved config.
"""

import difflib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, get_args

import yaml
from pydantic import BaseModel, ValidationError

from flux_cluster.config.hf import with_model_task
from flux_cluster.config.schema import SystemConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.resources import systems_dir

SYSTEMS_PATH_ENV = "FLUX_CLUSTER_SYSTEMS"
"""os.pathsep-separated folders of site system configs, searched before the shipped ones."""

# ${VAR}, ${VAR:-default}, and $$ for a literal '$'.
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_FREE_FORM = {"env"}  # mappings whose keys are user data, not schema fields


MAX_YAML_BYTES = 4 * 2**20
"""A config file is a few KB; this bounds what a read holds in memory."""
MAX_YAML_DEPTH = 64
"""Nesting levels, aliases followed (PyYAML composes recursively: deeper input is a RecursionError)."""
MAX_YAML_VALUES = 100_000
"""Nodes of a document, aliases expanded (a few hundred bytes of nested aliases expand to gigabytes)."""


class YamlLimitError(yaml.MarkedYAMLError):
    """Input that is valid YAML but hostile or ambiguous: too deep, too big once expanded, recursive,
    or with a key given twice. Never read as plain text (as --set does with other YAML errors)."""


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, hardened: nesting depth, expanded size and recursive aliases are bounded and
    duplicate keys refused, each as a YamlLimitError with its line.

    YAML 1.1 reads '12:00:00' as the base-60 integer 43200; here such values stay strings (walltimes).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        self._depth += 1
        self._composed += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlLimitError(
                    problem=f"nested more than {MAX_YAML_DEPTH} levels deep",
                    problem_mark=self.peek_event().start_mark,
                )
            if self._composed > MAX_YAML_VALUES:
                raise YamlLimitError(
                    problem=f"more than {MAX_YAML_VALUES} values", problem_mark=self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        _check_graph(node)
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError as exc:  # a number over Python's 4300-digit limit, a date that does not exist
            problem = f"invalid value {_short(node.value)}: {str(exc).split(';')[0]}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def _check_graph(root: yaml.Node) -> None:
    """Depth and size with aliases followed (memoised per node, so a bomb costs its own size), recursive
    aliases, and duplicate keys (named with both lines)."""
    height: dict[int, int] = {}  # levels at and below a node
    size: dict[int, int] = {}  # values at and below a node, capped just above the limit
    active: set[int] = set()

    def fail(node: yaml.Node, key: str, problem: str) -> None:
        raise YamlLimitError(problem=f"{key or '(top level)'}: {problem}", problem_mark=node.start_mark)

    def visit(node: yaml.Node, depth: int, key: str) -> None:
        if id(node) in active:
            fail(node, key, "an alias refers to a value that contains it (a recursive structure)")
        if depth + height.get(id(node), 1) - 1 > MAX_YAML_DEPTH:
            fail(node, key, f"nested more than {MAX_YAML_DEPTH} levels deep once aliases are expanded")
        if id(node) in height:
            return
        children: list[tuple[yaml.Node, str]] = []
        if isinstance(node, yaml.SequenceNode):
            children = [(child, f"{key}.{i}".lstrip(".")) for i, child in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], yaml.Node] = {}
            for key_node, value_node in node.value:
                scalar = isinstance(key_node, yaml.ScalarNode)
                name = f"{key}.{key_node.value}".lstrip(".") if scalar else key
                if scalar and key_node.tag != "tag:yaml.org,2002:merge":
                    seen = first.setdefault((key_node.tag, key_node.value), key_node)
                    if seen is not key_node:
                        fail(
                            key_node,
                            name,
                            f"duplicate key (first at line {seen.start_mark.line + 1}); "
                            "each key may appear once",
                        )
                children += [(key_node, name), (value_node, name)]
        active.add(id(node))
        for child, child_key in children:
            visit(child, depth + 1, child_key)
        active.discard(id(node))
        height[id(node)] = 1 + max((height[id(c)] for c, _ in children), default=0)
        size[id(node)] = min(1 + sum(size[id(c)] for c, _ in children), MAX_YAML_VALUES + 1)
        if size[id(node)] > MAX_YAML_VALUES:
            fail(node, key, f"more than {MAX_YAML_VALUES} values once aliases are expanded")

    visit(root, 1, "")


ConfigLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)\Z"),
    list("-+0123456789"),
)
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
    ),
    list("-+0123456789."),
)


class Override(NamedTuple):
    """One override as load_system takes it (a plain 'KEY=VALUE' string is Override(text))."""

    text: str
    """'KEY=VALUE'; a mapping value ('train={mode: lora}') replaces everything below KEY."""
    origin: str = "--set"
    """Where it came from, as errors and 'systems show' name it."""
    chosen: bool = True
    """The user's choice for the run; False: a value flux-cluster derived for it (a throughput sweep's
    one-step batch), which ResolvedSystem.chosen leaves out."""


class _RunChoice(str):
    """The flag on a source whose keys are the run's own choice (ResolvedSystem.chosen): an override the
    user gave, or the system's ``benchmarks.<workload>:`` section. Only load_system sees it."""


@dataclass(frozen=True)
class ResolvedSystem:
    config: SystemConfig
    sources: dict[str, str]
    """Dotted key -> where its value came from."""
    file: Path
    chosen: frozenset[str] = frozenset()
    """The keys this run chose: set by an override the user gave (--set, a sweep's grid; a mapping sets
    the keys it holds) or by the system's ``benchmarks.<workload>:`` section. Not the system's ``train:``
    section (a site's own system file included: its values are that system's defaults), nor a value a
    sweep derived (Override.chosen False)."""

    def source_of(self, key: str) -> str:
        return self.sources.get(key, "default")

    def chosen_for_run(self, key: str) -> str | None:
        """Where this run's own choice of key came from; None where the value is the system's default."""
        return self.sources[key] if key in self.chosen else None


def search_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(SYSTEMS_PATH_ENV, "").split(os.pathsep) if p]
    return [*extra, systems_dir()]


def known_systems() -> dict[str, Path]:
    """Selectable systems by name; files starting with '_' are bases for ``extends`` only."""
    found: dict[str, Path] = {}
    for folder in reversed(search_dirs()):  # earlier folders win
        for path in sorted(folder.glob("*.yaml")):
            if not path.name.startswith("_"):
                found[path.stem] = path
    return dict(sorted(found.items()))


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _find_file(name: str, near: Path | None = None) -> Path:
    # Any entry counts (a FIFO or a folder too): reading it then says what is wrong with it.
    if name.endswith((".yaml", ".yml")) and os.path.lexists(name):
        return Path(name)
    folders = ([near] if near else []) + search_dirs()
    for folder in folders:
        candidate = folder / f"{name}.yaml"
        if os.path.lexists(candidate):
            return candidate
    known = ", ".join(known_systems())
    hint = difflib.get_close_matches(name, list(known_systems()), n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise FluxClusterError(f"unknown system {name!r}{did_you_mean}; known systems: {known}")


_FILE_KINDS = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}


def _read_text(path: Path) -> str:
    """A regular file's UTF-8 text, at most MAX_YAML_BYTES; opening never blocks (a FIFO is refused)."""
    where = _display(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FluxClusterError(f"{where}: cannot read: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS.items() if test(mode)), "a device")
            raise FluxClusterError(f"{where}: is {kind}, not a file; expected a YAML file")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_YAML_BYTES:
                raise FluxClusterError(
                    f"{where}: larger than {MAX_YAML_BYTES // 2**20} MiB; expected a config file of a few KB"
                )
    except OSError as exc:
        raise FluxClusterError(f"{where}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FluxClusterError(f"{where}: not UTF-8 text (byte {exc.start})") from None


def _yaml_problem(exc: Exception) -> str:
    """'line N: problem' of a YAML error, one line."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or "invalid YAML"
    if isinstance(exc, RecursionError):
        problem = "nested too deeply"
    return f"{where}{problem}"


def parse_yaml(text: str) -> Any:
    """One YAML document with the config loader (bounded depth and size, no duplicate keys); raises
    YamlLimitError, other yaml.YAMLError or ValueError."""
    return yaml.load(text, Loader=ConfigLoader)


def load_yaml_safely(path: Path) -> Any:
    """Read a YAML file a user or a run may have left in any state: a system config, a run's config.yaml.

    Any problem is one FluxClusterError line naming the file (and the line and key where known): a FIFO,
    folder or device instead of a file, a file over MAX_YAML_BYTES, text that is not UTF-8, invalid YAML,
    nesting deeper than MAX_YAML_DEPTH, more than MAX_YAML_VALUES values once aliases are expanded (alias
    bombs), recursive aliases, a key given twice. Memory stays bounded by the limits.
    """
    text = _read_text(Path(path))
    try:
        return parse_yaml(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise FluxClusterError(f"{_display(Path(path))}: {_yaml_problem(exc)}") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    data = load_yaml_safely(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FluxClusterError(f"{_display(path)}: expected a mapping of keys at the top level")
    return data


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted leaves. Nested mappings become dotted keys, so a child file overrides single values."""
    leaves: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            leaves.update(_flatten(value, f"{dotted}."))
        else:
            leaves[dotted] = value
    return leaves


def _unflatten(leaves: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for dotted, value in leaves.items():
        node = tree
        *parents, last = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a scalar replaced by a mapping further down the chain
                child = node[part] = {}
            node = child
        node[last] = value
    return tree


def _load_chain(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    if path.resolve() in seen:
        chain = " -> ".join(_display(p) for p in (*seen, path.resolve()))
        raise FluxClusterError(f"{_display(path)}: extends: cycle {chain}")
    data = _read_yaml(path)
    bases = data.pop("extends", [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise FluxClusterError(f"{_display(path)}: extends: expected a system name or a list of names")
    leaves: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for base in bases:
        base_leaves, base_sources = _load_chain(_find_file(base, near=path.parent), (*seen, path.resolve()))
        _merge(leaves, sources, base_leaves, base_sources)
    own = _flatten(data)
    _merge(leaves, sources, own, dict.fromkeys(own, _display(path)))
    return leaves, sources


def _merge(leaves: dict, sources: dict, new: Mapping[str, Any], new_sources: Mapping[str, str]) -> None:
    for key, value in new.items():
        # A new value replaces the key and everything below it (e.g. 'env: {}' clears a base's env).
        for old in [k for k in leaves if k.startswith(f"{key}.") or key.startswith(f"{k}.")]:
            del leaves[old]
            sources.pop(old, None)
        leaves[key] = value
        sources[key] = new_sources[key]


def _interpolate(leaves: dict[str, Any], sources: dict[str, str], environ: Mapping[str, str]) -> None:
    def expand(value: Any, key: str, used: list[str]) -> Any:
        if isinstance(value, list):
            return [expand(v, key, used) for v in value]
        if not isinstance(value, str):
            return value

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, default = match.group(1), match.group(2)
            used.append(name)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise FluxClusterError(
                f"{sources[key]}: {key}: environment variable {name} is not set "
                f"(export it, or write ${{{name}:-default}})"
            )

        return _VAR.sub(replace, value)

    for key in list(leaves):
        used: list[str] = []
        leaves[key] = expand(leaves[key], key, used)
        if used:
            sources[key] = f"{sources[key]} (${{{'}, ${'.join(used)}}})"


def _select_benchmark(leaves: dict[str, Any], sources: dict[str, str], benchmark: object) -> None:
    """A system's ``benchmarks.<name>:`` train values apply when train.benchmark is <name>, above its
    ``train:`` section and below --set: hyperparameters tuned for one workload on this system (the local
    flux1 demo's learning rate) never leak into another (fine-tuning a real checkpoint)."""
    from flux_cluster.config.training import TrainConfig
    from flux_cluster.resources import benchmarks_dir

    known = {p.stem for p in benchmarks_dir().glob("*.yaml")}
    benchmark = benchmark if benchmark is not None else TrainConfig.model_fields["benchmark"].default
    chosen = {}
    for key in [k for k in leaves if k == "benchmarks" or k.startswith("benchmarks.")]:
        value, source = leaves.pop(key), sources.pop(key)
        parts = key.split(".", 2)
        if len(parts) <= 2 and value in ({}, None):  # 'finetune: {}' (or 'benchmarks: {}') clears a base's
            continue
        if len(parts) < 3 or parts[1] not in known or parts[2].split(".")[0] not in TrainConfig.model_fields:
            raise FluxClusterError(
                f"{source}: {key}: expected benchmarks.<workload>.<train key> "
                f"(workloads: {', '.join(sorted(known))})"
            )
        if parts[1] == benchmark:
            chosen[f"train.{parts[2]}"] = (value, _RunChoice(f"{source} (benchmarks.{benchmark})"))
    _merge(leaves, sources, {k: v for k, (v, _) in chosen.items()}, {k: o for k, (_, o) in chosen.items()})


def _parse_override(text: str, origin: str = "--set") -> tuple[str, Any]:
    if not _is_text(text):  # an undecodable byte in argv arrives as a lone surrogate
        raise FluxClusterError(f"{origin} {text!r}: not valid UTF-8 text; expected KEY=VALUE")
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise FluxClusterError(f"{origin} {text!r}: expected KEY=VALUE, e.g. --set nodes=4")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except YamlLimitError as exc:
        raise FluxClusterError(f"{origin}: {key}: {exc.problem}") from None
    except (yaml.YAMLError, ValueError):
        value = raw  # not YAML (e.g. 'a: b'): the text itself
    return key, value


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(leaves: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Every key and string is encodable text (no lone surrogate from a YAML escape or an environment
    variable), so nothing fails later while writing the run's config or script."""

    def strings(value: Any) -> list[str]:
        if isinstance(value, Mapping):
            return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
        if isinstance(value, list):
            return [s for item in value for s in strings(item)]
        return [value] if isinstance(value, str) else []

    for key, value in leaves.items():
        bad = next((s for s in [key, *strings(value)] if not _is_text(s)), None)
        if bad is not None:
            raise FluxClusterError(
                f"{sources[key]}: {ascii(key)[1:-1]}: {bad!a} is not valid UTF-8 text (a lone surrogate)"
            )


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = SystemConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        sub = [a for a in (field.annotation, *get_args(field.annotation)) if isinstance(a, type)]
        nested = [a for a in sub if issubclass(a, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _origin(key: str, sources: Mapping[str, str], file: Path) -> str:
    """Who set the value at key: itself, else something below it, else its nearest parent, else the file."""
    children = [sources[k] for k in sources if k.startswith(f"{key}.")]
    parents = [sources[k] for k in _parents(key) if k in sources]
    return sources.get(key) or next(iter(children + parents), _display(file))


def _value_at(tree: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    for part in loc:
        in_mapping = isinstance(tree, Mapping) and part in tree
        in_list = isinstance(tree, list) and isinstance(part, int) and part < len(tree)
        if not (in_mapping or in_list):
            return False, None
        tree = tree[part]
    return True, tree


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _explain(
    error: Mapping[str, Any], tree: Mapping[str, Any], sources: Mapping[str, str], file: Path
) -> str:
    is_key = "[key]" in error["loc"]  # pydantic's marker: the check failed on a mapping's key itself
    loc = tuple(p for p in error["loc"] if p != "[key]")
    origin = _origin(".".join(str(p) for p in loc), sources, file)
    key = ".".join(_key_part(p) for p in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        model = _model_at(loc[:-1])
        options = list(model.model_fields) if model else []
        hint = difflib.get_close_matches(str(loc[-1]), options, n=1, cutoff=0.5)
        suggestion = f"; did you mean {'.'.join([*map(str, loc[:-1]), hint[0]])!r}?" if hint else ""
        valid = f" (valid keys here: {', '.join(options)})" if options and not hint else ""
        return f"{origin}: {key}: unknown key{suggestion}{valid}"
    message = str(error["msg"])
    for prefix, replacement in (("Input should be ", "expected "), ("Value error, ", ""), ("String ", "")):
        if message.startswith(prefix):
            message = replacement + message[len(prefix) :]
    if error["type"] == "missing":
        return f"{origin}: {key}: required key is missing"
    if is_key and error["type"] != "value_error":
        return f"{origin}: {key}: this name {message}"
    found, value = _value_at(tree, loc)
    if found and error["type"] != "value_error":
        return f"{origin}: {key}: got {_short(value)} ({type(value).__name__}), {message}"
    return f"{origin}: {key}: {message}"


def _key_part(part: object) -> str:
    """A key as written, quoted when it holds a line break or other whitespace (the error stays one line)."""
    text = str(part)
    return text if text.isprintable() and not any(c.isspace() for c in text) else ascii(text)


def _parents(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def load_system(
    name: str,
    overrides: Sequence[str | tuple[str, str] | Override] = (),
    environ: Mapping[str, str] | None = None,
) -> ResolvedSystem:
    """Resolve a system by name (or YAML path): extends chain, ${VAR} expansion, overrides.

    An override is 'KEY=VALUE' (recorded as coming from --set), ('KEY=VALUE', 'its origin') or an
    Override.
    """
    environ = os.environ if environ is None else environ
    path = _find_file(name)
    leaves, sources = _load_chain(path)
    _interpolate(leaves, sources, environ)
    parsed = []
    for override in overrides:
        item = Override(override) if isinstance(override, str) else Override(*override)
        origin = _RunChoice(item.origin) if item.chosen else item.origin
        parsed.append((*_parse_override(item.text, item.origin), origin))
    for key, value, origin in parsed:  # a workload's section first: --set benchmarks.flux1.x=... works too
        if key.split(".")[0] == "benchmarks":
            _merge_override(leaves, sources, key, value, origin)
    benchmark = next((v for k, v, _ in reversed(parsed) if k == "train.benchmark"), None)
    _select_benchmark(leaves, sources, leaves.get("train.benchmark") if benchmark is None else benchmark)
    for key, value, origin in parsed:
        if key.split(".")[0] != "benchmarks":
            _merge_override(leaves, sources, key, value, origin)
    _check_text(leaves, sources)
    leaves.setdefault("name", path.stem)
    sources.setdefault("name", _display(path))
    tree = _unflatten(leaves)
    try:
        config = SystemConfig.model_validate(tree)
    except ValidationError as exc:
        raise FluxClusterError(_explain(exc.errors()[0], tree, sources, path)) from None
    chosen = frozenset(key for key, source in sources.items() if isinstance(source, _RunChoice))
    plain = {key: str(source) for key, source in sources.items()}
    config = config.model_copy(update={"hf": with_model_task(config.hf, config.train.benchmark, plain)})
    return ResolvedSystem(config=config, sources=plain, file=path, chosen=chosen)


def _merge_override(leaves: dict, sources: dict, key: str, value: Any, origin: str) -> None:
    """An override replaces key and everything below it; a mapping's values then become leaves of their
    own, as a file's do, so each remembers where it came from ('train={mode: lora}' sets train.mode)."""
    _merge(leaves, sources, {key: value}, {key: origin})
    flat = _flatten({key: value})
    if list(flat) != [key]:
        _merge(leaves, sources, flat, dict.fromkeys(flat, origin))


def flat_view(resolved: ResolvedSystem) -> list[tuple[str, Any, str]]:
    """(key, value, source) rows of the fully resolved config, defaults included."""
    dumped = resolved.config.model_dump(mode="json")
    rows = []
    for key, value in _flatten(dumped).items():
        free_form_parent = key.split(".")[0] in _FREE_FORM
        source = resolved.sources.get(key) or (
            next((resolved.sources[p] for p in _parents(key) if p in resolved.sources), None)
            if free_form_parent
            else None
        )
        rows.append((key, value, source or "default"))
    return rows
