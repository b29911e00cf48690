"""Under export, attention masks built with nested `torch.vmap` become one call of the mask function on broadcast
index tensors; eager keeps vmap.

Why: a vmap-built mask exports, but the graph keeps functorch ops, and the `TransformGetItemToIndex` context that
lets mask functions index tensors under vmap leaves a `flat_apply` node, so `torch.export.save` fails and ONNX /
ExecuTorch cannot take the program. Broadcasting gives the same mask: the indices go in shaped `[B,1,1,1]`,
`[1,H,1,1]`, `[1,1,Q,1]`, `[1,1,1,KV]`, the mask function runs once, and the result is expanded to the full shape.

What it rewrites:
- a *vmap expansion helper*: a function that ends in `for dims in <dimensions>: f = torch.vmap(f, in_dims=dims,
  out_dims=0)` then `return f`, where every `<dimensions>` entry in the function is a literal tuple with exactly one
  `0` and `None` elsewhere (`_vmap_expansion_sdpa` of transformers 5.x, `_vmap_for_bhqkv` of 4.56/4.57). Under
  `torch.compiler.is_exporting()` it returns, before the loop, a nested function that reshapes each mapped index to
  its own axis (the last vmap applied is the outermost axis, as vmap stacks it), calls `f` once and expands the
  result; unmapped arguments pass through. Eager keeps the loop: a mask function users pass (`or_mask_function`,
  `use_vmap=True`) may rely on vmap's 0-d indices (`pm[b][kv]`), and eager must not change;
- `with TransformGetItemToIndex():` around calls of a rewritten helper enters `nullcontext()` under export instead
  (no vmap, so nothing to transform; indexing with broadcast index tensors is ordinary advanced indexing);
- inside *mask functions* (a `def` or `lambda` with four positional parameters, the last two `q_idx`, `kv_idx`), the
  constructs that only work on the 0-d indices vmap passes: chained indexing `pm[b][kv]` -> `pm[b, kv]` (each inner
  index an index value or an int literal), Python `min`/`max` of two values -> `torch.minimum`/`torch.maximum`
  (both index values) or `torch.clamp(x, max=c)`/`torch.clamp(x, min=c)`, and `a if c else b` with an index-valued
  `c` -> `torch.where(c, a, b)`.

Equivalence rests on the contract of a mask function: one boolean per `(batch, head, q, kv)` (the original's mask
is not 4-D otherwise). Elementwise ops then commute with broadcasting.

What it refuses (left unchanged, reported with the reason): a mask function that branches on an index value
(`if`/`while`/`and`/`or`/`not`/`assert`), reduces or reads shapes of one (`.sum()`, `.item()`, `.shape`, `len`),
slices with one, passes one to a builtin or `torch` function that is not elementwise, to a function of the module
that is not a mask function or to an imported one (neither is analysed), or defines a function inside;
chained indexing whose inner index is another tensor; a helper whose dimensions are not literal. A module with a
refused mask function keeps its vmap helper, and a model module with one keeps importing transformers' own
`masking_utils` when vendored (`SHARED_MODULE`), so its masks stay as they were.
"""

from __future__ import annotations

import builtins

import libcst as cst
import libcst.matchers as m

from .base import Codemod, imports_torch
from ._candidates import CandidateStatements
from ._imports import add_from_import
from ._walks import child_nodes

GET_ITEM_TO_INDEX = "torch._dynamo._trace_wrapped_higher_order_op.TransformGetItemToIndex"
# Functions of an index value that act elementwise (so they commute with broadcasting)
ELEMENTWISE_TORCH = frozenset(
    "abs bitwise_and bitwise_not bitwise_or bitwise_xor clamp div eq floor_divide fmod full_like ge gt le "
    "logical_and logical_not logical_or logical_xor lt maximum minimum ne ones_like remainder sign where "
    "zeros_like".split()
)
ELEMENTWISE_METHODS = frozenset(
    "abs bool clamp clamp_max clamp_min eq fmod ge gt int le long lt ne new_full new_ones new_zeros remainder to "
    "type_as float".split()
)
# Builtins that are elementwise on a tensor (`abs`) or that this codemod rewrites (`min`, `max`)
ALLOWED_BUILTINS = frozenset({"abs", "min", "max"})
BUILTINS = frozenset(dir(builtins))

BROADCAST_EXPANSION = """
if torch.compiler.is_exporting():
    # One call on broadcast index tensors instead of nested `torch.vmap` (no functorch ops in an exported graph):
    # each mapped index gets its own axis, the last vmap applied being the outermost, and the result, which may
    # have size-1 axes, is expanded to the full shape. Eager keeps vmap, which any mask function supports.
    def broadcast_mask_function(*indices):
        axes = [dims.index(0) for dims in reversed({dimensions})]
        views = list(indices)
        for axis, position in enumerate(axes):
            shape = [1] * len(axes)
            shape[axis] = -1
            views[position] = indices[position].reshape(shape)
        return {function}(*views).expand([indices[position].shape[0] for position in axes])

    return broadcast_mask_function
"""
# Under export the mask function runs on broadcast index tensors: plain advanced indexing, no context needed (it would
# leave a `flat_apply` node that `torch.export.save` rejects)
UNWRAPPED_CONTEXT = "nullcontext() if torch.compiler.is_exporting() else {context}"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _names(node: cst.CSTNode) -> set[str]:
    """The names `node` reads or binds, but attribute names (`x` of `x.y`): a walk of the fields."""
    found, pending = set(), [node]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is cst.Name:
            found.add(node.value)
        elif kind is cst.Attribute:
            pending.append(node.value)
            continue
        pending.extend(child_nodes(node))
    return found


def _mask_parameters(params: cst.Parameters) -> list[str] | None:
    """The parameter names of a mask function signature, else None."""
    positional = [*params.posonly_params, *params.params]
    if len(positional) != 4 or params.kwonly_params or isinstance(params.star_arg, cst.Param):
        return None
    names = [param.name.value for param in positional]
    return names if names[2:] == ["q_idx", "kv_idx"] else None


class _MaskFunctionCheck(cst.CSTVisitor):
    """Walks one mask function: which names hold index values, what to rewrite, what to refuse."""

    def __init__(self, parameters: list[str], qualified, position, unanalysed: frozenset[str]) -> None:
        self.indexed = set(parameters)  # names whose value derives from an index
        self.qualified = qualified
        self.position = position
        self.unanalysed = unanalysed  # names of the module's other functions and of its imports
        self.refusals: list[tuple[int, str, str]] = []  # (line, construct, reason)
        self.rewrites: dict[cst.CSTNode, str] = {}  # original node -> what it becomes (for the finding)

    def _is_indexed(self, node: cst.CSTNode | None) -> bool:
        return node is not None and bool(_names(node) & self.indexed)

    def _refuse(self, node: cst.CSTNode, reason: str) -> None:
        construct = _code(node).strip().splitlines()[0]
        self.refusals.append((self.position(node), construct, reason))

    # Scopes: the mask function itself is entered by the caller; anything nested is refused
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._refuse(node, "a function defined inside the mask function: not analysed")
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self._refuse(node, "a lambda inside the mask function: not analysed")
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        if self._is_indexed(node.value):
            for target in node.targets:
                self.indexed |= _names(target.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if self._is_indexed(node.value):
            self.indexed |= _names(node.target)

    def visit_If(self, node: cst.If) -> None:
        if self._is_indexed(node.test):
            self._refuse(node.test, "Python `if` on an index value: its truth value is one element under vmap only")

    def visit_While(self, node: cst.While) -> None:
        if self._is_indexed(node.test):
            self._refuse(node.test, "`while` on an index value")

    def visit_For(self, node: cst.For) -> None:
        if self._is_indexed(node.iter):
            self._refuse(node.iter, "a loop over an index value")

    def visit_Assert(self, node: cst.Assert) -> None:
        if self._is_indexed(node.test):
            self._refuse(node.test, "`assert` on an index value")

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        if self._is_indexed(node):
            self._refuse(node, "`and`/`or` on an index value: Python truth value of a tensor")

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if isinstance(node.operator, cst.Not) and self._is_indexed(node.expression):
            self._refuse(node, "`not` on an index value: Python truth value of a tensor")

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if self._is_indexed(node.test):
            self.rewrites[node] = "a if c else b -> torch.where(c, a, b)"

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # Methods are judged in visit_Call; these read the shape, which differs (0-d under vmap, 4-D broadcast)
        if self._is_indexed(node.value) and node.attr.value in ("shape", "ndim", "T", "mT"):
            self._refuse(node, f"`.{node.attr.value}` of an index value: 0-d under vmap, 4-D when broadcast")

    def visit_Call(self, node: cst.Call) -> None:
        if not any(self._is_indexed(arg.value) for arg in node.args) and not (
            isinstance(node.func, cst.Attribute) and self._is_indexed(node.func.value)
        ):
            return
        func = node.func
        qualified = self.qualified(func)
        torch_names = {q.removeprefix("torch.") for q in qualified if q.startswith("torch.")}
        if torch_names:
            # bucketize is elementwise in its input; the boundaries must be the same for every element
            bucketized = "bucketize" in torch_names and not any(self._is_indexed(arg.value) for arg in node.args[1:])
            if not torch_names & ELEMENTWISE_TORCH and not bucketized:
                self._refuse(node, f"`torch.{min(torch_names)}` is not elementwise on an index value")
            return
        if isinstance(func, cst.Attribute) and self._is_indexed(func.value):
            if func.attr.value not in ELEMENTWISE_METHODS:
                self._refuse(node, f"`.{func.attr.value}()` of an index value is not elementwise")
            return
        if isinstance(func, cst.Name) and func.value in BUILTINS and qualified <= {f"builtins.{func.value}"}:
            if func.value not in ALLOWED_BUILTINS:
                self._refuse(node, f"the builtin `{func.value}` of an index value")
            elif func.value in ("min", "max"):
                if len(node.args) != 2 or any(arg.keyword or arg.star for arg in node.args):
                    self._refuse(node, f"`{func.value}` with other than two positional arguments")
                else:
                    self.rewrites[node] = f"{func.value} -> tensor op"
            return
        # A parameter or closure variable (another mask function) is judged where it is defined; a function of this
        # module that is not a mask function, an import or any other callable is not analysed
        if not isinstance(func, cst.Name) or func.value in self.unanalysed:
            self._refuse(node, f"`{_code(func)}` of an index value: not a mask function, not analysed")

    def visit_Subscript(self, node: cst.Subscript) -> None:
        elements = node.slice
        if any(not isinstance(e.slice, cst.Index) and self._is_indexed(e.slice) for e in elements):
            self._refuse(node, "slicing with an index value")
            return
        if not isinstance(node.value, cst.Subscript) or not any(self._is_indexed(e.slice) for e in elements):
            return
        inner = node.value
        simple = all(isinstance(e.slice, cst.Index) for e in (*inner.slice, *elements))
        scalar = all(
            self._is_indexed(e.slice.value) or isinstance(e.slice.value, cst.Integer)
            for e in inner.slice
            if isinstance(e.slice, cst.Index)
        )
        if simple and scalar:
            self.rewrites[node] = "x[i][j] -> x[i, j]"
        else:
            self._refuse(node, "chained indexing whose inner index is not an index value or an int")


class _ApplyMaskRewrites(cst.CSTTransformer):
    """Builds the rewrites `_MaskFunctionCheck` chose, from the updated nodes (so nested ones compose)."""

    def __init__(self, chosen: dict[cst.CSTNode, str], indexed_of: dict[cst.CSTNode, bool]) -> None:
        self.chosen = chosen
        self.indexed_of = indexed_of  # min/max argument -> whether it is an index value

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if original not in self.chosen:
            return updated
        inner = updated.value
        elements = [*inner.slice, *updated.slice]
        elements = [
            e.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for e in elements[:-1]
        ] + [elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
        return updated.with_changes(value=inner.value, slice=elements)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if original not in self.chosen:
            return updated
        name = original.func.value
        first, second = (arg.value for arg in updated.args)
        first_indexed, second_indexed = (self.indexed_of[arg.value] for arg in original.args)
        if first_indexed and second_indexed:
            op = "minimum" if name == "min" else "maximum"
            return cst.parse_expression(f"torch.{op}(a, b)").with_changes(
                args=[cst.Arg(first, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(second)]
            )
        tensor, bound = (first, second) if first_indexed else (second, first)
        keyword = "max" if name == "min" else "min"
        call = cst.parse_expression(f"torch.clamp(x, {keyword}=c)")
        return call.with_changes(args=[call.args[0].with_changes(value=tensor), call.args[1].with_changes(value=bound)])

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        if original not in self.chosen:
            return updated
        call = cst.parse_expression("torch.where(c, a, b)")
        values = (updated.test, updated.body, updated.orelse)
        return call.with_changes(args=[arg.with_changes(value=v) for arg, v in zip(call.args, values)])


class _VmapHelper:
    """A matched vmap expansion helper: its `for` loop, the function it vmaps, and the dimensions' name."""

    def __init__(self, node: cst.FunctionDef, loop: cst.For, function: str, dimensions: str) -> None:
        self.node, self.loop, self.function, self.dimensions = node, loop, function, dimensions


def _dims_are_literal(node: cst.FunctionDef, dimensions: str) -> bool:
    """Every value the function gives `dimensions` is a list of tuples with one `0` and `None` elsewhere."""

    def one_axis(element: cst.BaseElement) -> bool:
        if not isinstance(element.value, cst.Tuple):
            return False
        values = [e.value for e in element.value.elements]
        zeros = [v for v in values if isinstance(v, cst.Integer) and v.value == "0"]
        nones = [v for v in values if m.matches(v, m.Name("None"))]
        return len(zeros) == 1 and len(zeros) + len(nones) == len(values)

    found = []
    for stmt in m.findall(node, m.Assign(targets=[m.AssignTarget(target=m.Name(dimensions))])):
        found.append(stmt.value)
    for call in m.findall(node, m.Call(func=m.Attribute(value=m.Name(dimensions)))):
        if call.func.attr.value not in ("extend", "append") or len(call.args) != 1:
            return False
        found.append(
            call.args[0].value if call.func.attr.value == "extend" else cst.List([cst.Element(call.args[0].value)])
        )
    if not found:
        return False
    return all(isinstance(v, (cst.List, cst.Tuple)) and all(map(one_axis, v.elements)) for v in found)


class VmapMasks(Codemod):
    NAME = "vmap-masks"
    DESCRIPTION = (
        "attention masks built with nested torch.vmap -> under export, one call of the mask function on "
        "broadcasting index tensors plus .expand (eager keeps vmap); mask functions made broadcast-safe where equivalent"
    )
    # A model module whose mask function this codemod refuses keeps importing transformers' own module
    SHARED_MODULE = "transformers.masking_utils"

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "vmap" in source or "kv_idx" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        walk = _ModuleWalk(tree)
        masks = [function for function in walk.functions if _mask_parameters(function.params) is not None]
        loop_functions = [function for function, _, _ in _vmap_loops(walk.functions)]
        if not masks and not loop_functions:
            return tree  # nothing to analyse: skip the scope analysis, the largest cost of this codemod
        # Only the top-level statements that hold a mask function or a vmap loop are analysed: visited for their
        # functions in source order, printed for their lines, and kept whole in the scope analysis, which sees the
        # other defs' and classes' bodies elided
        holding = {id(walk.owners[id(function)]) for function in (*masks, *loop_functions)}
        functions = _functions([stmt for stmt in tree.body if id(stmt) in holding])
        loops = _vmap_loops(functions)
        # The `with`s a helper rewrite may unwrap (their context is resolved): those whose statements all call a
        # call of a loop's function
        loop_names = {function.name.value for function, _, _ in loops}
        withs = [
            node for node in walk.withs if loops and all(_calls_helper(stmt, loop_names) for stmt in node.body.body)
        ]
        scopes = [*masks, *loop_functions, *withs]
        statements = CandidateStatements(self, tree, [walk.owners[id(node)] for node in scopes], scopes)
        qualified, line = statements.qualified, statements.line

        has_torch = imports_torch(tree)
        unanalysed = frozenset(
            {
                f.name.value
                for f in walk.functions
                if isinstance(f, cst.FunctionDef) and _mask_parameters(f.params) is None
            }
            | _imported_names(walk.imports)
        )
        chosen: dict[cst.CSTNode, str] = {}
        indexed_of: dict[cst.CSTNode, bool] = {}
        refused_lines: list[int] = []
        rewritten: set[int] = set()  # ids of the top-level statements that hold a mask function with rewrites
        for function in functions:
            parameters = _mask_parameters(function.params)
            if parameters is None:
                continue
            check = _MaskFunctionCheck(parameters, qualified, line, unanalysed)
            body = function.body
            if isinstance(function, cst.FunctionDef):
                for stmt in body.body:
                    stmt.visit(check)
            else:
                body.visit(check)
            if check.refusals:
                refused_lines.append(line(function))
                for at, construct, reason in sorted(check.refusals):
                    self.report(at, "refused", construct, reason)
                continue
            if check.rewrites and not has_torch:
                refused_lines.append(line(function))
                for node in check.rewrites:
                    self.report(line(node), "refused", _code(node), "the module does not `import torch`")
                continue
            rewritten.add(id(walk.owners[id(function)]))
            for node, what in check.rewrites.items():
                chosen[node] = what
                if isinstance(node, cst.Call):
                    for arg in node.args:
                        indexed_of[arg.value] = check._is_indexed(arg.value)
                self.report(line(node), "rewritten", _code(node), what)

        helpers = self._helpers(loops, qualified, line, refused_lines)
        if not chosen and not helpers:
            return tree
        return self._rewrite(tree, walk, chosen, indexed_of, helpers, withs, qualified, rewritten)

    def _helpers(self, loops, qualified, line, refused_lines) -> list[_VmapHelper]:
        helpers = []
        for function, loop, after in loops:
            assign = loop.body.body[0].body[0]
            call = assign.value
            if qualified(call.func) != {"torch.vmap"}:
                continue
            target = assign.targets[0].target.value
            dims = loop.target.value
            args = {arg.keyword.value if arg.keyword else index: arg.value for index, arg in enumerate(call.args)}
            construct = f"def {function.name.value}"
            shaped = (
                len(args) == 3
                and m.matches(args.get(0, cst.Ellipsis()), m.Name(target))
                and m.matches(args.get("in_dims", args.get(1, cst.Ellipsis())), m.Name(dims))
                and m.matches(args.get("out_dims", args.get(2, cst.Ellipsis())), m.Integer("0"))
                and m.matches(after, m.SimpleStatementLine(body=[m.Return(m.Name(target))]))
            )
            if not shaped:
                self.report(
                    line(loop),
                    "refused",
                    construct,
                    "a torch.vmap loop of another shape than f = torch.vmap(f, in_dims=dims, out_dims=0); return f",
                )
            elif not _dims_are_literal(function, loop.iter.value):
                self.report(
                    line(loop),
                    "refused",
                    construct,
                    f"`{loop.iter.value}` is not a literal list of one-axis in_dims tuples",
                )
            elif refused_lines:
                lines = ", ".join(map(str, refused_lines))
                self.report(
                    line(function),
                    "refused",
                    construct,
                    f"the module's mask functions at lines {lines} are not broadcast-safe",
                )
            else:
                self.report(
                    line(function), "rewritten", construct, "nested torch.vmap -> broadcast index tensors + expand"
                )
                helpers.append(_VmapHelper(function, loop, target, loop.iter.value))
        return helpers

    def _rewrite(self, tree, walk, chosen, indexed_of, helpers, withs, qualified, rebuilt) -> cst.Module:
        """The mask rewrites and the helper rewrites, in one pass over the top-level statements that hold them (the
        others stay the same objects)."""
        by_node = {helper.node: helper for helper in helpers}
        names = {helper.node.name.value for helper in helpers}
        config = tree.config_for_parsing
        unwrapped = {
            node
            for node in withs
            if isinstance(node.items[0].item, cst.Call)
            and qualified(node.items[0].item.func) == {GET_ITEM_TO_INDEX}
            and all(_calls_helper(stmt, names) for stmt in node.body.body)
        }

        class _Rewrite(_ApplyMaskRewrites):
            def leave_FunctionDef(self, original, updated):
                helper = by_node.get(original)
                if helper is None:
                    return updated
                template = BROADCAST_EXPANSION.format(dimensions=helper.dimensions, function=helper.function)
                exporting = cst.parse_statement(template.lstrip("\n"), config=config)
                body = list(updated.body.body)
                index = next(i for i, stmt in enumerate(original.body.body) if stmt is helper.loop)
                leading = body[index].leading_lines
                blank = [] if leading and leading[0].comment is None else [cst.EmptyLine(indent=False)]
                # the export form goes before the loop, which eager still runs
                body[index:index] = [exporting.with_changes(leading_lines=[*blank, *leading])]
                body[index + 1] = body[index + 1].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
                return updated.with_changes(body=updated.body.with_changes(body=body))

            def leave_With(self, original, updated):
                if original not in unwrapped:
                    return updated
                item = updated.items[0]
                context = UNWRAPPED_CONTEXT.format(context=cst.Module([]).code_for_node(item.item))
                return updated.with_changes(items=[item.with_changes(item=cst.parse_expression(context))])

        rewrite = _Rewrite(chosen, indexed_of)
        rebuilt = rebuilt | {id(walk.owners[id(node)]) for node in (*by_node, *unwrapped)}
        body = []
        for stmt in tree.body:
            stmt = stmt.visit(rewrite) if id(stmt) in rebuilt else stmt
            body.extend(stmt.nodes if isinstance(stmt, cst.FlattenSentinel) else [stmt])
        tree = tree.with_changes(body=body)
        if unwrapped:
            tree = add_from_import(tree, "contextlib", 0, "nullcontext")
        return tree


def _calls_helper(stmt: cst.CSTNode, names: set[str]) -> bool:
    """Whether `stmt` calls the result of a call (`helper(f)(...)`) and every such call is of one of `names`."""
    calls = m.findall(stmt, m.Call(func=m.Call(func=m.Name())))
    return bool(calls) and all(call.func.func.value in names for call in calls)


class _ModuleWalk:
    """One walk of a module's fields: every def and lambda (`functions`, not in source order) with the top-level
    statement that holds it (`owners`, by id, also for the `with`s), the imports, and the `with`s whose first item
    is a call of a name or an attribute."""

    def __init__(self, tree: cst.Module) -> None:
        self.functions: list[cst.FunctionDef | cst.Lambda] = []
        self.imports: list[cst.Import | cst.ImportFrom] = []
        self.withs: list[cst.With] = []
        self.owners: dict[int, cst.BaseStatement] = {}
        for owner in tree.body:  # the header and footer hold only comments
            pending = [owner]
            while pending:
                node = pending.pop()
                kind = type(node)
                if kind is cst.FunctionDef or kind is cst.Lambda:
                    self.functions.append(node)
                    self.owners[id(node)] = owner
                elif kind is cst.Import or kind is cst.ImportFrom:
                    self.imports.append(node)
                elif kind is cst.With and m.matches(node, _CALLED_CONTEXT):
                    self.withs.append(node)
                    self.owners[id(node)] = owner
                pending.extend(child_nodes(node))


_CALLED_CONTEXT = m.With(items=[m.WithItem(item=m.Call(func=m.Name() | m.Attribute()))])


def _functions(statements: list[cst.BaseStatement]) -> list[cst.FunctionDef | cst.Lambda]:
    """Every `def` and `lambda` in `statements`, in source order (one plain walk: matchers cost several times
    more)."""
    found = []

    class _Collect(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            found.append(node)

        def visit_Lambda(self, node: cst.Lambda) -> None:
            found.append(node)

    collect = _Collect()
    for stmt in statements:
        stmt.visit(collect)
    return found


_VMAP_LOOP = m.For(
    target=m.Name(),
    iter=m.Name(),
    body=m.IndentedBlock(
        body=[m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Call())])]
    ),
)


# `if torch.compiler.is_exporting():`, the branch a rewritten helper holds before its loop
_EXPORTING_BRANCH = m.If(
    test=m.Call(
        func=m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("compiler")), attr=m.Name("is_exporting"))
    )
)


def _vmap_loops(functions: list[cst.FunctionDef | cst.Lambda]) -> list[tuple[cst.FunctionDef, cst.For, cst.CSTNode]]:
    """(function, loop, next statement) for each `for d in dims: f = <call>(...)` in a function's top-level body:
    the shape of a nested-vmap helper, before the call is resolved to `torch.vmap`."""
    loops = []
    for function in functions:
        if not isinstance(function, cst.FunctionDef) or not isinstance(function.body, cst.IndentedBlock):
            continue
        stmts = list(function.body.body)
        if any(m.matches(stmt, _EXPORTING_BRANCH) for stmt in stmts):
            continue  # rewritten already: eager's loop stays beside the export form
        loops += [
            (function, loop, after)
            for loop, after in zip(stmts, stmts[1:])
            if type(loop) is cst.For and m.matches(loop, _VMAP_LOOP)
        ]
    return loops


def _imported_names(imports: list[cst.Import | cst.ImportFrom]) -> set[str]:
    found = set()
    for node in imports:
        if not isinstance(node.names, cst.ImportStar):
            found |= {(alias.evaluated_alias or alias.evaluated_name).split(".")[0] for alias in node.names}
    return found
