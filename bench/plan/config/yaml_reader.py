"""The hardened YAML reader: a sweep file read within bounds (a regular file, 1 MiB, UTF-8),
parsed as yaml.safe_load parses it but refusing a key given twice, a scalar that cannot be
built, and a document too deep or too large once its aliases are expanded; every refusal a
one-line ConfigError."""

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from bench.errors import ConfigError
from bench.plan.config.messages import SHOW_CHARS, _show, _show_path


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping in the YAML gives one key twice (YAML forbids it; PyYAML keeps the last)."""

    def __init__(self, key: Any, line: int, first_line: int, texts: tuple[str, str]) -> None:
        self.key, self.line, self.first_line = key, line, first_line
        self.texts = texts  # as written: `1` and `true` differ in YAML, not in a Python dict
        super().__init__(problem=f"key {_show(key)} appears twice (lines {first_line} and "
                         f"{line})")

    def message(self, where: str) -> str:
        if self.texts[0] == self.texts[1]:
            return (f"{where}: key {_show(self.key)} at line {self.line} appears twice (first "
                    f"at line {self.first_line}); give each key once")
        return (f"{where}: keys {self.texts[0]!r} (line {self.first_line}) and "
                f"{self.texts[1]!r} (line {self.line}) are one key once read (both "
                f"{_show(self.key)}); give each key once")


# What a sweep file (or a --set value) may hold, checked before anything is built from it:
MAX_CONFIG_BYTES = 2**20  # a sweep file: 1 MiB (read no further)
MAX_SET_BYTES = 2**16  # one --set value: 64 KiB
MAX_SET_PARTS = 8  # dotted parts of a --set key (runner_options.<runner>.<option> has 3)
MAX_YAML_DEPTH = 32  # levels of nesting, aliases expanded
# nodes plus the characters of the scalars, aliases expanded: an alias bomb (anchors of
# anchors, each listing the one before ten times) grows tenfold a line; refused here, before
# Python objects are built, whatever the value is for
MAX_YAML_SIZE = 4 * MAX_CONFIG_BYTES


class YamlTooLarge(yaml.YAMLError):
    """A YAML document past a bound (MAX_YAML_DEPTH, MAX_YAML_SIZE): what, where, what is
    allowed."""

    def __init__(self, what: str, allowed: str, mark: Any = None) -> None:
        where = f" at line {mark.line + 1}" if mark is not None else ""
        self.what, self.allowed = what + where, allowed
        super().__init__(self.what)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping, at any depth (a second
    `runners:` line would silently replace the first), turns a scalar that cannot be
    built (an int of more than 4300 digits, the 13th month) into a YAMLError with its line,
    and refuses a document nested more than MAX_YAML_DEPTH levels or larger than
    MAX_YAML_SIZE once its aliases are expanded (YamlTooLarge), before building it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()
        self._depth = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node): (size, levels), expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlTooLarge(f"nested more than {MAX_YAML_DEPTH} levels deep",
                                   f"YAML nested at most {MAX_YAML_DEPTH} levels deep",
                                   self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node: Any = super().compose_document()  # a node: a document was checked for
        self._expanded(node, 1)
        return node

    def _expanded(self, node: yaml.Node, depth: int) -> tuple[int, int]:
        """(size, levels) of node with its aliases expanded: its nodes plus its scalars'
        characters, and the levels it nests; YamlTooLarge past a bound. Each node once (an
        alias is the node it names), so the cost is the document's, not the expansion's."""
        known = self._sizes.get(id(node))
        if known is None:
            if depth > MAX_YAML_DEPTH:  # an alias of an alias ..., or of its own anchor
                raise YamlTooLarge(f"nested more than {MAX_YAML_DEPTH} levels deep once its "
                                   "aliases are expanded",
                                   f"YAML nested at most {MAX_YAML_DEPTH} levels deep",
                                   node.start_mark)
            if isinstance(node, yaml.ScalarNode):
                known = (1 + len(node.value), 0)
            else:
                children = [n for pair in node.value for n in pair] \
                    if isinstance(node, yaml.MappingNode) else node.value
                size, levels = 1, 0
                for child in children:
                    child_size, child_levels = self._expanded(child, depth + 1)
                    size, levels = size + child_size, max(levels, child_levels + 1)
                    if size > MAX_YAML_SIZE:
                        break
                known = (size, levels)
            self._sizes[id(node)] = known
        if depth + known[1] > MAX_YAML_DEPTH:
            raise YamlTooLarge(f"nested more than {MAX_YAML_DEPTH} levels deep once its "
                               "aliases are expanded",
                               f"YAML nested at most {MAX_YAML_DEPTH} levels deep",
                               node.start_mark)
        if known[0] > MAX_YAML_SIZE:
            raise YamlTooLarge(f"more than {MAX_YAML_SIZE:,} nodes and characters once its "
                               "aliases are expanded", "YAML whose aliases expand to at most "
                               f"{MAX_YAML_SIZE:,} nodes and characters", node.start_mark)
        return known

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Here, before flattening merges the keys of `<<: *anchor` into the node (keys a
        # mapping may override), see the node's own keys once.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) \
                        or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # unhashable: construct_mapping says so
                    continue
                if first is not key_node:
                    raise DuplicateKeyError(key, key_node.start_mark.line + 1,
                                            first.start_mark.line + 1,
                                            (str(first.value), str(key_node.value)))
        super().flatten_mapping(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError,
                IndexError) as exc:  # e.g. `2024-13-01`, `!!bool maybe`, `!!timestamp 1`
            text = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            shown = repr(text) if len(str(text)) <= 40 else repr(str(text)[:37]) + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown} as {node.tag.rsplit(':', 1)[-1]} "
                f"({type(exc).__name__}: {exc})",
                node.start_mark) from None


def parse_yaml(text: str, where: str) -> Any:
    """YAML text into Python objects (as yaml.safe_load, refusing a key given twice), or a
    ConfigError that starts with `where` (the file or the --set value)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except DuplicateKeyError as exc:
        raise ConfigError(exc.message(where)) from None
    except YamlTooLarge as exc:
        raise ConfigError(f"{where} is not allowed: {exc.what}; allowed: {exc.allowed}"
                          ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML ({_yaml_reason(exc)})") from None
    except RecursionError:
        raise ConfigError(f"{where} is not allowed; allowed: YAML nested less deeply") from None


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
    problem = " ".join(problem.split())  # one line
    if len(problem) > 2 * SHOW_CHARS:  # it may quote a token: an alias or tag 1 MiB long
        problem = f"{problem[:2 * SHOW_CHARS]}... ({len(problem)} characters)"
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def read_config_text(path: Path) -> str:
    """The text of a sweep file: a regular file (a FIFO or a device is refused before it is
    read: /dev/zero would never end), at most MAX_CONFIG_BYTES of it read, in UTF-8; a
    ConfigError naming --config otherwise."""
    shown = _show_path(path)
    try:
        # O_NONBLOCK: opening a FIFO waits for no writer (it is refused below, unread)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ConfigError(f"--config: {shown} does not exist; allowed: a path to a YAML "
                          "file (e.g. configs/cpu-smoke.yaml)") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"--config: {shown} cannot be read "
                          f"({getattr(exc, 'strerror', None) or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "no regular file")
            raise ConfigError(f"--config: {shown} is {kind}; allowed: a YAML file")
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"--config: {shown} cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"--config: {shown} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; "
                          f"allowed: a YAML file of at most {MAX_CONFIG_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config: {shown} is not UTF-8 text (byte {exc.start}); "
                          "allowed: a YAML file in UTF-8") from None
