"""Mixture-of-experts loops over the experts hit get, under export, a loop over every expert (a static trip count).

Why: the eager expert loop of MoE blocks visits only the experts that received tokens,
`expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()` then `for expert_idx in expert_hit:`. Under
torch.export the length of `expert_hit` is data-dependent (an unbacked size), and iterating over it fails with
`GuardOnDataDependentSymNode`; so does indexing an `nn.ModuleList` with the tensor `expert_idx`.

What it rewrites, in any block of a function: a loop `for V in H:` (or `in H[:]`) where `H` is bound earlier in the
same block (or in a `with` block just before it) from `torch.greater(M.sum(...), 0).nonzero()` and `M` is the expert
mask (experts first). Under `torch.compiler.is_exporting()` the loop visits every expert, `range(M.shape[0])`, in
the same ascending order; an expert that received no tokens has an all-zero row of `M`, so its `torch.where(M[V])` is
empty and its `index_add_` adds nothing: the accumulation order of the experts that did receive tokens is the same,
and the results are bit-identical. Eager runs the original loop. The form depends on how the body uses `V`:
- a body that starts with `V = V[0]` (`V` a 0-d tensor in eager), where `H` is read nowhere else, keeps the loop as
  it is and changes only what it iterates: `if torch.compiler.is_exporting(): H = [[V] for V in range(M.shape[0])]`
  before it, so `V[0]` is the expert's Python int (torch indexes with a 0-d integer tensor as with an int, also as
  one element of a multi-element index, `M[V]`, `self.down_proj[V]`, `routing_weights[T, V, None]`, a ModuleList takes
  either, and `if V == n: continue` compares the same values). Three lines instead of a second copy of the loop, as
  an upstream reviewer wants it;
- otherwise the loop gets an export twin, `if torch.compiler.is_exporting(): for V in range(M.shape[0]): ...`
  `else:` the original loop. `V` is a 1-element tensor in eager: in the twin `M[V]` and `self.<parameter>[V]`
  become `[V : V + 1]` (the same values and shape, a view where a list index would copy the expert's weights), `V[0]`
  becomes `V`, `self.<module list>[V]` stays (a ModuleList takes the int); a body starting with `V = V[0]` whose `H`
  is read elsewhere drops that statement in the twin.

What it refuses (left unchanged, reported): a body whose effect on an expert without tokens is not provably nothing:
anything but assignments to plain names, `with torch.no_grad():` blocks of them, `if V == ...: continue` and
`A.index_add_(0, T, ...)` where `T` comes from `torch.where(M[V]...)` in the body; a call to an in-place method
(`x.add_(...)`) other than that `index_add_`; a name bound in the loop (or `V`) that the function uses outside it
(its value after the loop would differ); any other use of `V` (a 1-element `V` in a multi-element index
`routing_weights[T, V, None]` is an advanced index, which no int slice reproduces); a subscript `X[V]` of something
that is neither `M` nor an `nn.Parameter`/`nn.ModuleList` the class assigns in `__init__` (a list, a dict, a
buffer); a module that does not `import torch`. In a `modular_*.py`, the `__init__` a class inherits from another
model is read in the class's generated expansion (`Codemod.expanded_class`), so the modular file is rewritten as the
modeling file generated from it is.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .base import EXPORTING, LINE_LENGTH, Codemod, export_twin, imports_torch
from ._statement_codes import statement_node_lines
from ._walks import name_values, statement_children, walk_statements

# `torch.greater(M.sum(...), 0).nonzero()`
EXPERTS_HIT = m.Call(
    func=m.Attribute(
        value=m.Call(
            func=m.Attribute(value=m.Name("torch"), attr=m.Name("greater")),
            args=[
                m.Arg(value=m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("sum")))),
                m.Arg(value=m.Integer("0")),
            ],
        ),
        attr=m.Name("nonzero"),
    ),
    args=[],
)
NO_GRAD = m.With(
    items=[
        m.WithItem(item=m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("no_grad")), args=[]), asname=None)
    ]
)
TORCH_WHERE = m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("where")), args=[m.Arg(keyword=None)])
EXPORT_CHOICE = m.If(test=EXPORTING)

COMMENT = (
    "# torch.export cannot loop over the experts hit (a data-dependent count): visit every expert in",
    "# the same ascending order; an expert without tokens has an empty `torch.where` and adds nothing",
)


def _nn_call(name: str) -> m.Call:
    return m.Call(
        func=m.Attribute(value=m.Name("nn"), attr=m.Name(name))
        | m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("nn")), attr=m.Name(name))
    )


def _self_attributes(cls: cst.ClassDef) -> tuple[frozenset[str], frozenset[str]]:
    """(parameters, module lists): the `self.<name>` that the class's `__init__` binds to `nn.Parameter(...)` and to
    `nn.ModuleList(...)`."""
    parameters, module_lists = set(), set()
    for stmt in cls.body.body:
        if not m.matches(stmt, m.FunctionDef(name=m.Name("__init__"))):
            continue
        for assign in m.findall(stmt, m.Assign(targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self")))])):
            name = assign.targets[0].target.attr.value
            if m.matches(assign.value, _nn_call("Parameter")):
                parameters.add(name)
            elif m.matches(assign.value, _nn_call("ModuleList")):
                module_lists.add(name)
    return frozenset(parameters), frozenset(module_lists)


def _bound_names(node: cst.CSTNode) -> set[str]:
    """Plain names that `node` binds (assignment targets, tuple elements, loop targets, `with ... as`): every name in
    those targets, read from a walk of the statements (the only places that hold them)."""
    names = set()
    for stmt in walk_statements(node):
        kind = type(stmt)
        if kind is cst.Assign:
            targets = [target.target for target in stmt.targets]
        elif kind is cst.AnnAssign or kind is cst.AugAssign or kind is cst.For:
            targets = [stmt.target]
        elif kind is cst.With:
            targets = [item.asname.name for item in stmt.items if item.asname is not None]
        else:
            continue
        for target in targets:
            names |= {target.value} if type(target) is cst.Name else name_values(target)
    return names


def _simple_statements(block: cst.BaseSuite) -> list[cst.BaseStatement]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else [cst.SimpleStatementLine(body=block.body)]


class _Refusal(Exception):
    pass


class _Loop:
    """One matched loop: checks its body and builds the export twin."""

    def __init__(self, loop: cst.For, mask: str, parameters: frozenset[str], module_lists: frozenset[str]):
        self.loop, self.mask = loop, mask
        self.var = loop.target.value
        self.parameters, self.module_lists = parameters, module_lists
        body = list(loop.body.body)
        self.unpacks = bool(body) and m.matches(
            body[0],
            m.SimpleStatementLine(
                body=[
                    m.Assign(
                        targets=[m.AssignTarget(target=m.Name(self.var))],
                        value=m.Subscript(
                            value=m.Name(self.var), slice=[m.SubscriptElement(slice=m.Index(value=m.Integer("0")))]
                        ),
                    )
                ]
            ),
        )
        self.body = body[1:] if self.unpacks else body

    def check(self, outside: list[cst.CSTNode]) -> None:
        """Raises `_Refusal` unless an expert without tokens provably changes nothing."""
        tokens: set[str] = set()
        accumulations = []
        if self.var in set().union(*(_bound_names(stmt) for stmt in self.body)):
            raise _Refusal(f"the loop body rebinds `{self.var}`")
        for stmt in self._flat(self.body):
            small = stmt.body[0]
            if isinstance(small, cst.Assign):
                if m.matches(small.value, TORCH_WHERE) and self._selects_expert_tokens(small.value.args[0].value):
                    tokens |= _bound_names(small)
                self._check_expression(small.value)
            else:
                accumulations.append(small.value)
        if not accumulations:
            raise _Refusal("the loop body accumulates nothing with `index_add_`")
        for call in accumulations:
            if not m.matches(call.args[1].value, m.Name()) or call.args[1].value.value not in tokens:
                raise _Refusal(
                    "an `index_add_` whose index does not come from `torch.where` over the expert's mask row"
                )
            for arg in call.args[2:]:
                self._check_expression(arg.value)
        bound = _bound_names(self.loop.body) | {self.var}
        accumulators = {call.func.value.value for call in accumulations}
        if self.mask in bound:
            raise _Refusal(f"the loop body rebinds the expert mask `{self.mask}`")
        if accumulators & bound:
            raise _Refusal("an `index_add_` into a tensor the loop body binds")
        leaked = sorted(bound & {n.value for node in outside for n in m.findall(node, m.Name())})
        if leaked:
            raise _Refusal(
                f"`{leaked[0]}` is bound in the loop and used outside it (its value after the loop differs)"
            )

    def _flat(self, statements) -> list[cst.BaseStatement]:
        flat = []
        for stmt in statements:
            if isinstance(stmt, cst.With) and m.matches(stmt, NO_GRAD):
                flat.extend(self._flat(_simple_statements(stmt.body)))
            elif (
                m.matches(
                    stmt,
                    m.If(
                        test=m.Comparison(left=m.Name(self.var), comparisons=[m.ComparisonTarget(operator=m.Equal())]),
                        body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Continue()])])
                        | m.SimpleStatementSuite(body=[m.Continue()]),
                        orelse=None,
                    ),
                )
                and self.unpacks
            ):
                self._check_expression(stmt.test.comparisons[0].comparator)
            elif m.matches(
                stmt,
                m.SimpleStatementLine(
                    body=[m.Assign(targets=[m.AtLeastN(n=1, matcher=m.AssignTarget(target=m.Name() | m.Tuple()))])]
                ),
            ) and all(
                (
                    all(isinstance(e.value, cst.Name) for e in t.target.elements)
                    if isinstance(t.target, cst.Tuple)
                    else True
                )
                for t in stmt.body[0].targets
            ):
                flat.append(stmt)
            elif m.matches(
                stmt,
                m.SimpleStatementLine(
                    body=[
                        m.Expr(
                            value=m.Call(
                                func=m.Attribute(value=m.Name(), attr=m.Name("index_add_")),
                                args=[
                                    m.Arg(value=m.Integer("0"), keyword=None),
                                    m.Arg(keyword=None),
                                    m.Arg(keyword=None),
                                ],
                            )
                        )
                    ]
                ),
            ):
                flat.append(stmt)
            else:
                raise _Refusal(
                    f"`{_one_line(stmt)}` in the loop body is not an assignment to local names or an `index_add_`"
                )
        return flat

    def _selects_expert_tokens(self, expr: cst.BaseExpression) -> bool:
        """`M[V]` or `M[V].squeeze(0)` (V a tensor), `M[V]` (V unpacked), `M[V[0]]`: the expert's row of the mask."""
        if m.matches(expr, m.Call(func=m.Attribute(attr=m.Name("squeeze")), args=[m.Arg(value=m.Integer("0"))])):
            if self.unpacks:
                return False
            expr = expr.func.value
        index = m.Name(self.var) if self.unpacks else m.Name(self.var) | _first(self.var)
        return m.matches(
            expr, m.Subscript(value=m.Name(self.mask), slice=[m.SubscriptElement(slice=m.Index(value=index))])
        )

    def _check_expression(self, expr: cst.BaseExpression) -> None:
        for node in m.findall(expr, m.Yield() | m.Await() | m.NamedExpr() | m.Lambda()):
            raise _Refusal(f"`{_one_line(node)}` in the loop body")
        for call in m.findall(expr, m.Call(func=m.Attribute())):
            attr = call.func.attr.value
            if attr.endswith("_") and not attr.endswith("__"):
                raise _Refusal(f"an in-place call `.{attr}(...)` in the loop body")
        allowed = {id(n) for n in self._allowed_uses(expr)}
        for use in m.findall(expr, m.Name(self.var)):
            if id(use) in allowed:
                continue
            for sub in m.findall(expr, m.Subscript(slice=[m.SubscriptElement(slice=m.Index(value=m.Name(self.var)))])):
                if sub.slice[0].slice.value is use:
                    raise _Refusal(
                        f"`{_one_line(sub)}` indexes neither the expert mask nor a parameter or module list that "
                        "`__init__` assigns"
                    )
            raise _Refusal(f"`{self.var}` is used in `{_one_line(expr)}` other than as the only index")

    def _allowed_uses(self, expr: cst.BaseExpression) -> list[cst.Name]:
        """The Name nodes of V inside `X[V]` (X the mask, a parameter or module list), `V[0]` (a tensor V), or one
        element of a multi-element index `X[T, V, None]` (V unpacked: torch indexes with a 0-d integer tensor as with
        an int, and only tensors take a multi-element index)."""
        allowed = []
        for sub in m.findall(expr, m.Subscript(slice=[m.SubscriptElement(slice=m.Index())])):
            index = sub.slice[0].slice.value
            if m.matches(index, m.Name(self.var)) and self._kind(sub.value) is not None:
                allowed.append(index)
            elif not self.unpacks and m.matches(sub, _first(self.var)):
                allowed.append(sub.value)
        if self.unpacks:
            for sub in m.findall(expr, m.Subscript(slice=[m.SubscriptElement(), m.AtLeastN(n=1)])):
                allowed.extend(
                    element.slice.value
                    for element in sub.slice
                    if m.matches(element, m.SubscriptElement(slice=m.Index(value=m.Name(self.var))))
                )
        return allowed

    def _kind(self, value: cst.BaseExpression) -> str | None:
        if m.matches(value, m.Name(self.mask)):
            return "tensor"
        if m.matches(value, m.Attribute(value=m.Name("self"))):
            if value.attr.value in self.parameters:
                return "tensor"
            if value.attr.value in self.module_lists:
                return "modules"
        return None

    def export_twin(self) -> cst.For:
        body = [_AdaptIndex(self).visit_statement(stmt) for stmt in self.body] if not self.unpacks else self.body
        if not body:
            body = [cst.SimpleStatementLine(body=[cst.Pass()])]
        header = cst.parse_statement(f"for {self.var} in range({self.mask}.shape[0]):\n    pass\n")
        return header.with_changes(body=self.loop.body.with_changes(body=body))


class _AdaptIndex(cst.CSTTransformer):
    """In the export twin of a loop whose V is a 1-element tensor in eager: `X[V]` -> `X[V : V + 1]` for tensors,
    `V[0]` -> `V`; module lists keep `X[V]`."""

    def __init__(self, loop: _Loop):
        super().__init__()
        self.loop = loop

    def visit_statement(self, stmt: cst.BaseStatement) -> cst.BaseStatement:
        return stmt.visit(self)

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        var = self.loop.var
        if m.matches(original_node, _first(var)):
            return cst.Name(var)
        if m.matches(original_node, m.Subscript(slice=[m.SubscriptElement(slice=m.Index(value=m.Name(var)))])):
            if self.loop._kind(original_node.value) == "tensor":
                one = cst.parse_expression(f"x[{var} : {var} + 1]").slice
                return updated_node.with_changes(slice=one)
        return updated_node


def _fitted(stmt: cst.If, depth: int) -> cst.If:
    """`stmt` laid out by black when a line, one level deeper than the loop it holds was, outgrows the line length."""
    code = cst.Module(body=[stmt]).code
    if max(len(line) for line in code.splitlines()) + 4 * depth <= LINE_LENGTH:
        return stmt
    import black  # rarely needed: importing black costs a tenth of a second

    formatted = black.format_str(code, mode=black.Mode(line_length=LINE_LENGTH - 4 * depth))
    return cst.parse_statement(formatted).with_changes(leading_lines=stmt.leading_lines)


def _first(var: str) -> m.Subscript:
    return m.Subscript(value=m.Name(var), slice=[m.SubscriptElement(slice=m.Index(value=m.Integer("0")))])


def _one_line(node: cst.CSTNode) -> str:
    code = cst.Module(body=[]).code_for_node(node).strip()
    first = code.splitlines()[0] if code else code
    return first if len(first) <= 100 else first[:97] + "..."


def _hit_binding(statements: list[cst.BaseStatement], hit: str) -> str | None:
    """The mask `M` of the last binding of `hit` among `statements` (or inside a `with` among them), if it is
    `hit = torch.greater(M.sum(...), 0).nonzero()`; None when the last binding has another form or M is rebound."""
    for position in range(len(statements) - 1, -1, -1):
        stmt = statements[position]
        candidates = [stmt] if not isinstance(stmt, cst.With) else list(reversed(_simple_statements(stmt.body)))
        for candidate in candidates:
            if hit not in _bound_names(candidate):
                continue
            if not m.matches(
                candidate,
                m.SimpleStatementLine(
                    body=[m.Assign(targets=[m.AssignTarget(target=m.Name(hit))], value=EXPERTS_HIT)]
                ),
            ):
                return None
            mask = candidate.body[0].value.func.value.args[0].value.func.value.value
            later = (
                statements[position + 1 :] + candidates[: next(i for i, c in enumerate(candidates) if c is candidate)]
            )
            return None if any(mask in _bound_names(s) for s in later) else mask
    return None


class MoeExpertLoop(Codemod):
    NAME = "moe-expert-loop"
    DESCRIPTION = (
        "MoE loops over the experts hit (`expert_hit.nonzero()`, a data-dependent count) loop over every expert under "
        "export; an expert without tokens adds nothing, eager keeps the original loop."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return ".nonzero()" in source and "index_add_" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Only a top-level statement that binds the experts hit can hold a loop to rewrite: the others are neither
        # visited nor rebuilt (the engine takes their text from the source), and line numbers come from printing the
        # candidates
        candidates = {index for index, stmt in enumerate(tree.body) if _binds_experts_hit(stmt)}
        if not candidates:
            return tree
        has_torch = imports_torch(tree)
        # Printed first, the candidates also place the statements before them in the source (their lines are
        # counted there, not printed)
        printed = {}
        for index in sorted(candidates):
            code, printed[index] = statement_node_lines(tree, tree.body[index], (cst.For,))
            self.remember_statement_code(tree, tree.body[index], code)
        body, changed = list(tree.body), False
        for index in sorted(candidates):
            line = self.first_line(tree, index)
            rewriter = _Rewriter(self, {key: line - 1 + value for key, value in printed[index].items()}, has_torch)
            new = tree.body[index].visit(rewriter)
            if rewriter.replacements:
                body[index], changed = new, True
        return tree.with_changes(body=body) if changed else tree


def _binds_experts_hit(node: cst.CSTNode) -> bool:
    """Whether `node` holds an assignment `H = torch.greater(M.sum(...), 0).nonzero()` (a walk of the fields)."""
    if type(node) is cst.Assign and m.matches(node.value, EXPERTS_HIT):
        return True
    return any(_binds_experts_hit(child) for child in statement_children(node))


class _Rewriter(cst.CSTTransformer):
    def __init__(self, codemod: MoeExpertLoop, loop_lines: dict[int, int], imports_torch: bool):
        super().__init__()
        self.codemod, self.loop_lines, self.imports_torch = codemod, loop_lines, imports_torch
        self.classes: list[tuple[frozenset[str], frozenset[str]]] = []
        self.functions: list[cst.FunctionDef] = []
        self.replacements: dict[int, list[cst.BaseStatement]] = {}  # id(original For) -> what replaces it
        self.depth = 0  # blocks around the statements being visited

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        parameters, module_lists = _self_attributes(node)
        # a modular file's class may inherit its `__init__`: its generated expansion holds what it assigns
        expanded = self.codemod.expanded_class(node.name.value)
        if expanded is not None:
            more_parameters, more_module_lists = _self_attributes(expanded)
            parameters, module_lists = parameters | more_parameters, module_lists | more_module_lists
        self.classes.append((parameters, module_lists))

    def leave_ClassDef(self, original_node, updated_node):
        self.classes.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node, updated_node):
        self.functions.pop()
        return updated_node

    def visit_If(self, node: cst.If) -> bool:
        return not m.matches(node, EXPORT_CHOICE)  # a twin emitted by a previous run, and the eager loop beside it

    def leave_IndentedBlock(self, original_node, updated_node):
        self.depth -= 1
        return updated_node

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1
        if not self.functions:
            return
        statements = list(node.body)
        for index, stmt in enumerate(statements):
            if not m.matches(
                stmt,
                m.For(
                    target=m.Name(),
                    iter=m.Name()
                    | m.Subscript(
                        value=m.Name(), slice=[m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None))]
                    ),
                    orelse=None,
                    asynchronous=None,
                ),
            ):
                continue
            hit = stmt.iter.value if isinstance(stmt.iter, cst.Name) else stmt.iter.value.value
            mask = _hit_binding(statements[:index], hit)
            if mask is None:
                continue
            self._rewrite(stmt, mask)

    def _rewrite(self, loop: cst.For, mask: str) -> None:
        line = self.loop_lines[id(loop)]  # the line of its `for`
        construct = f"for {loop.target.value} in {_one_line(loop.iter)}"
        parameters, module_lists = self.classes[-1] if self.classes else (frozenset(), frozenset())
        matched = _Loop(loop, mask, parameters, module_lists)
        function = self.functions[-1]
        outside = _outside(function, loop)
        try:
            if not self.imports_torch:
                raise _Refusal("the module does not `import torch`")
            matched.check(outside)
        except _Refusal as refusal:
            self.codemod.report(line, "refused", construct, str(refusal))
            return
        comment = "".join(f"    {c}\n" for c in COMMENT)
        hit = _one_line(loop.iter.value if isinstance(loop.iter, cst.Subscript) else loop.iter)
        if matched.unpacks and len(m.findall(function, m.Name(hit))) == 2:  # bound, then iterated: nothing else
            # The smallest change: under export, what the loop iterates is every expert, as `nonzero()`'s rows
            # (`[V]`), so the loop and its body stay as they are
            var = matched.var
            text = f"if torch.compiler.is_exporting():\n{comment}    {hit} = [[{var}] for {var} in range({mask}.shape[0])]\n"
            choice = _fitted(cst.parse_statement(text).with_changes(leading_lines=loop.leading_lines), self.depth)
            self.replacements[id(loop)] = [choice, loop.with_changes(leading_lines=())]
        else:
            text = f"if torch.compiler.is_exporting():\n{comment}    pass\nelse:\n    pass\n"
            replacement = export_twin(text, [loop], loop.leading_lines, export=[matched.export_twin()])
            self.replacements[id(loop)] = [_fitted(replacement, self.depth)]
        self.codemod.report(line, "rewritten", construct, f"loops over range({mask}.shape[0]) under export")

    def leave_For(self, original_node: cst.For, updated_node: cst.For):
        replacement = self.replacements.get(id(original_node))
        return cst.FlattenSentinel(replacement) if replacement else updated_node


def _after(statements, loop: cst.For) -> list[cst.CSTNode] | None:
    """What can run after `loop` among `statements` (None when the loop is not among them): the statements that
    follow it in its block and in every block around it, and a whole loop or `try` around it (which can run again
    or jump). The other arms of an `if` around it cannot run after it."""
    for index, stmt in enumerate(statements):
        if stmt is loop:
            return list(statements[index + 1 :])
        for suite in _suites(stmt):
            inner = _after(suite, loop)
            if inner is not None:
                again = [stmt] if isinstance(stmt, (cst.For, cst.While, cst.Try)) else []
                return inner + again + list(statements[index + 1 :])
    return None


def _suites(stmt: cst.CSTNode) -> list[list[cst.BaseStatement]]:
    """The statement lists directly inside a compound statement (not inside nested functions or classes)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or not isinstance(stmt, cst.BaseCompoundStatement):
        return []
    suites = [_simple_statements(stmt.body)]
    orelse = getattr(stmt, "orelse", None)
    if isinstance(orelse, cst.If):
        suites.append([orelse])
    elif orelse is not None:
        suites.append(_simple_statements(orelse.body))
    if isinstance(stmt, cst.Try):
        suites += [_simple_statements(handler.body) for handler in stmt.handlers]
        suites += [_simple_statements(stmt.finalbody.body)] if stmt.finalbody else []
    return suites


def _outside(function: cst.FunctionDef, loop: cst.For) -> list[cst.CSTNode]:
    """The code of `function` that can read a name after `loop` has bound it: what runs after the loop, and every
    nested function or lambda (which can be called after it)."""
    after = _after(list(function.body.body), loop) or []
    nested = [node for node in m.findall(function.body, m.FunctionDef() | m.Lambda()) if not _inside(node, loop)]
    return after + nested


def _inside(node: cst.CSTNode, loop: cst.For) -> bool:
    return any(found is node for found in m.findall(loop, type(node)))
