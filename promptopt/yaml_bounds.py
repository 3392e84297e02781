"""Reading YAML so that no file can hang or exhaust a reader: the limits every card, task file and search space is read
within, and a loader that stops at the first node past them (promptopt/yamlio.py reads files with it). The same
loader refuses a mapping that names one key twice (PyYAML keeps the last silently: a space or card with two
`instruction:` keys would load as whichever came last)."""

from __future__ import annotations

import yaml

# What a YAML file (a card, a task file, a search space) may hold, so that no file can hang or exhaust a reader: its
# size, its nesting, and its node count once aliases are expanded (an alias counts as a copy of what it names: a
# 689-byte "billion laughs" file is a billion nodes to whatever walks it, as an error message or a hash does).
# An exported card of MMLU's 14,042 test items is about 0.5 MB and 15,000 nodes.
MAX_YAML_BYTES = 4 << 20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64


class YAMLLimit(yaml.MarkedYAMLError):
    """A YAML document beyond what promptopt reads (MAX_YAML_DEPTH, MAX_YAML_NODES, an alias inside what it names)."""


def check_unique_keys(node) -> None:
    """A ConstructorError at the second occurrence of a key in one mapping (its own keys: a `<<` merge may be
    overridden, as YAML means). Keys compare as written (tag and text), so no value is constructed twice."""
    seen = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = (key_node.tag, key_node.value)
        if key in seen:
            shown = key_node.value if len(key_node.value) <= 40 else key_node.value[:37] + "..."
            raise yaml.constructor.ConstructorError(
                problem=f"duplicate key {shown!r} (first on line {seen[key].line + 1}): each key once",
                problem_mark=key_node.start_mark,
            )
        seen[key] = key_node.start_mark


def _bounded_loader(parser: type) -> type:
    """yaml.SafeLoader's reading on `parser` (libyaml's, fast, where PyYAML has it), with a composer that stops at
    the first node past the limits instead of building (or recursing into) the whole document."""

    class BoundedLoader(yaml.composer.Composer, parser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        def __init__(self, stream) -> None:
            parser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._depth, self._nodes, self._sizes = 0, 0, {}

        def compose_node(self, parent, index):
            mark = self.peek_event().start_mark
            if self.check_event(yaml.AliasEvent):
                node = super().compose_node(parent, index)
                if id(node) not in self._sizes:
                    raise YAMLLimit(
                        problem="an alias inside the node it names (a structure that contains itself)",
                        problem_mark=mark,
                    )
                self._nodes += self._sizes[id(node)]
                if self._nodes > MAX_YAML_NODES:
                    raise YAMLLimit(
                        problem=f"more than {MAX_YAML_NODES:,} nodes once its aliases are expanded", problem_mark=mark
                    )
                return node
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise YAMLLimit(problem=f"nested deeper than {MAX_YAML_DEPTH} levels", problem_mark=mark)
            self._nodes += 1
            if self._nodes > MAX_YAML_NODES:
                raise YAMLLimit(problem=f"more than {MAX_YAML_NODES:,} nodes", problem_mark=mark)
            before = self._nodes - 1
            node = super().compose_node(parent, index)
            self._depth -= 1
            self._sizes[id(node)] = self._nodes - before  # this node and everything under it, aliases expanded
            return node

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                check_unique_keys(node)
            return super().construct_mapping(node, deep=deep)

    return BoundedLoader


class _PythonParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    """PyYAML's pure-Python reader, scanner and parser: where PyYAML was built without libyaml."""

    def __init__(self, stream) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


try:  # libyaml's parser (scanning in C, ~7x faster than PyYAML's own), where PyYAML was built with it
    from yaml._yaml import CParser as _Parser
except ImportError:
    _Parser = _PythonParser
BoundedSafeLoader = _bounded_loader(_Parser)
PythonBoundedSafeLoader = _bounded_loader(_PythonParser)  # the same limits on PyYAML's own parser (tests)
