"""Walks of the fields of libcst nodes: several times cheaper than a visitor or a matcher search, for finding the few
nodes a codemod looks at, and rebuilding only the nodes on the way to a replacement."""

from __future__ import annotations

from dataclasses import fields

import libcst as cst


def nodes_in(node: cst.CSTNode, wanted) -> list[cst.CSTNode]:
    """The nodes in `node` (itself included) that `wanted(node)` accepts, from a walk of the fields (see
    `child_nodes`), several times cheaper than a matcher search; not in source order."""
    found, pending = [], [node]
    while pending:
        node = pending.pop()
        if wanted(node):
            found.append(node)
        pending.extend(child_nodes(node))
    return found


def holds(node: cst.CSTNode, found) -> bool:
    """Whether `node` or a node inside it is one that `found(node)` accepts: a walk of the fields (see
    `child_nodes`), several times cheaper than a visitor or a matcher search."""
    pending = [node]
    while pending:
        node = pending.pop()
        if found(node):
            return True
        pending.extend(child_nodes(node))
    return False


def candidates_in_statements(tree: cst.Module, test, find) -> tuple[list, dict]:
    """The candidates `find(statement)` gives (tuples whose first item is the candidate node) in the top-level
    statements of `tree` that `holds` a node `test` accepts, and candidate node -> the statement holding it."""
    candidates, owners = [], {}
    for owner in tree.body:
        if holds(owner, test):
            for found in find(owner):
                candidates.append(found)
                owners[found[0]] = owner
    return candidates, owners


class ReplaceNodes(cst.CSTTransformer):
    """Puts each replacement where its original node is (by identity)."""

    def __init__(self, replacements: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.replacements = replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        replacement = self.replacements.get(original_node)
        return replacement if replacement is not None else super().on_leave(original_node, updated_node)


def replace_in_statements(tree: cst.Module, replacements: dict[cst.CSTNode, cst.CSTNode], statements) -> cst.Module:
    """`tree` with each replacement where its original node is (by identity). Only `statements` (the top-level
    statements that hold the originals) are walked, and only the nodes on the way down to an original are rebuilt:
    the others stay the same objects (the engine prints an unchanged top-level statement once), without a
    transformer's visit, which rebuilds every node."""
    if not replacements:
        return tree
    new_of = {id(original): new for original, new in replacements.items()}
    rebuilt = {id(stmt) for stmt in statements}
    return tree.with_changes(body=[_rebuilt(stmt, new_of) if id(stmt) in rebuilt else stmt for stmt in tree.body])


def _rebuilt(node: cst.CSTNode, new_of: dict[int, cst.CSTNode]) -> cst.CSTNode:
    new = new_of.get(id(node))
    if new is not None:
        return new
    changes = {}
    for name in _child_fields(node):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            items = [_rebuilt(item, new_of) if descends(type(item)) else item for item in value]
            if any(item is not old for item, old in zip(items, value)):
                changes[name] = items
        elif descends(kind):
            item = _rebuilt(value, new_of)
            if item is not value:
                changes[name] = item
    return node.with_changes(**changes) if changes else node


def scoped_nodes(node: cst.CSTNode, kinds: tuple[type, ...]) -> list[tuple[cst.CSTNode, str, tuple]]:
    """(found, qualname, functions) for each node of exactly one of `kinds` in `node` (itself included): `qualname`
    the names of the classes and defs around it in `node` joined (`Class.method`), `functions` the defs around it,
    innermost last. A walk of the fields (several times cheaper than a visitor); not in source order."""
    found = []
    pending = [(node, (), ())]
    while pending:
        node, scopes, functions = pending.pop()
        kind = type(node)
        if kind in kinds:
            found.append((node, ".".join(scopes), functions))
        if kind is cst.ClassDef:
            scopes = (*scopes, node.name.value)
        elif kind is cst.FunctionDef:
            scopes, functions = (*scopes, node.name.value), (*functions, node)
        pending.extend((child, scopes, functions) for child in child_nodes(node))
    return found


# Nodes that hold only whitespace, comments and punctuation: searches for statements and expressions skip them
_TOKENS = (
    cst.BaseParenthesizableWhitespace,
    cst.EmptyLine,
    cst.TrailingWhitespace,
    cst.Newline,
    cst.Comment,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.Comma,
    cst.Semicolon,
    cst.Dot,
    cst.Colon,
    cst.AssignEqual,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
# type -> whether its instances are nodes to descend into (not tokens). libcst's base classes are ABCs, whose
# isinstance checks cost more than the walk; a dict lookup by exact type does not.
_DESCEND: dict[type, bool] = {}


def descends(kind: type) -> bool:
    found = _DESCEND.get(kind)
    if found is None:
        found = _DESCEND[kind] = issubclass(kind, cst.CSTNode) and not issubclass(kind, _TOKENS)
    return found


# Nodes whose fields hold only a value and parentheses, the most frequent nodes of a module (names above all)
_LEAVES = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis})


def _child_fields(node: cst.CSTNode) -> tuple[str, ...]:
    names = _CHILD_FIELDS.get(type(node))
    if names is None:
        names = _CHILD_FIELDS[type(node)] = tuple(f.name for f in fields(node))
    return names


def child_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of `node` but tokens, read from its fields: what a libcst visitor would descend into, without
    the visitor's dispatch at every node (several times the cost). Order is field order, not always source order:
    for searches whose answer is a set."""
    if type(node) in _LEAVES:
        return []
    found = []
    for name in _child_fields(node):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            found.extend(item for item in value if descends(type(item)))
        elif descends(kind):
            found.append(value)
    return found


def _suites(node: cst.CSTNode) -> list:
    kind = type(node)
    if kind is cst.If or kind is cst.For or kind is cst.While:
        return [node.body, node.orelse]
    if kind is cst.Try or kind is cst.TryStar:
        return [node.body, *node.handlers, node.orelse, node.finalbody]
    if kind is cst.Match:
        return list(node.cases)
    return [node.body]


# type -> how to find the statements inside its instances (see `statement_children`)
_STATEMENT_CHILDREN: dict[type, object] = {}


def statement_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The statements, blocks and small statements directly inside `node`, in source order: all a search for
    statements (an `if`, an assignment, a `def`) needs to descend into. Expressions, parameters, decorators and the
    other fields hold no statement, and skipping them makes the search several times cheaper than `child_nodes`."""
    kind = type(node)
    how = _STATEMENT_CHILDREN.get(kind)
    if how is None:
        if issubclass(kind, (cst.IndentedBlock, cst.SimpleStatementSuite, cst.SimpleStatementLine)):
            how = "body"
        elif issubclass(kind, cst.BaseSmallStatement):
            how = "none"
        elif issubclass(
            kind,
            (
                cst.ClassDef,
                cst.FunctionDef,
                cst.With,
                cst.For,
                cst.While,
                cst.If,
                cst.Try,
                cst.TryStar,
                cst.Else,
                cst.Finally,
                cst.ExceptHandler,
                cst.ExceptStarHandler,
                cst.Match,
                cst.MatchCase,
            ),
        ):
            how = "suites"
        else:
            how = "fields"  # anything else: every child node, as `child_nodes` gives them
        _STATEMENT_CHILDREN[kind] = how
    if how == "body":
        return list(node.body)
    if how == "none":
        return []
    if how == "suites":
        return [suite for suite in _suites(node) if suite is not None]
    return child_nodes(node)


def walk_statements(node: cst.CSTNode):
    """`node` and every statement, block and small statement inside it (nested defs included), in source order: what
    `m.findall` of a statement or small statement matcher visits, without a visitor's dispatch at every node."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(reversed(statement_children(current)))


def name_values(node: cst.CSTNode) -> set[str]:
    """The values of every `Name` node in `node` (attribute names included), as `m.findall(node, m.Name())` finds
    them, from a walk of the fields."""
    values, pending = set(), [node]
    while pending:
        current = pending.pop()
        if type(current) is cst.Name:
            values.add(current.value)
        else:
            pending.extend(child_nodes(current))
    return values
