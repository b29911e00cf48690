"""A recurrence stepped in a Python loop over the sequence is one `scan` under export.

Why: the reference path of Mamba's selective scan (and of its copies in Falcon-Mamba, Jamba, Zamba) steps a state
through the sequence, `for index in range(seq_len): ssm_state = A[:, :, index] * ssm_state + B[:, :, index]`, and
stacks each step's output. torch.export unrolls a Python loop, so the program holds as many steps as the example had
tokens, and its length is pinned (`Constraints violated (tokens)`): no program serves another prompt length.
`torch._higher_order_ops.scan` is that loop as one operator over a length the program takes as an input: the same
step, traced once, applied to each position in order, its outputs stacked.

What it rewrites: in a function of a model module (`transformers.models.*`, or a file outside transformers) that does
`import torch`, the three statements

    L = []
    for I in range(N):
        <assignments to names>
        L.append(E)
    Y = torch.stack(L, dim=D)

where `N` is a name, `I` appears only as one index of a tensor named `X` bound outside the loop, every other index a
full slice (`X[:, :, I]`: the step's slice of X along that dim), and the loop's names are read after it only when they
carry its state (a name the body reads before it assigns it: `ssm_state`) or are `Y`. Under export:

    def scan_step(carry, steps):
        (<carried names>,) = carry
        <X>_at_step, ... = steps
        <the assignments, each `X[:, :, I]` now `<X>_at_step`>
        return [<carried names>], E

    torch._check(N > 0)
    (<carried names>,), stacked_steps = scan(scan_step, [<carried names>], [X.movedim(d, 0), ...])
    Y = stacked_steps.movedim(0, D)

`X.movedim(d, 0)[i]` is `X[:, ..., i]` with i at dim d, and `scan` stacks the step outputs on dim 0, which `movedim(0,
D)` puts where `torch.stack(L, dim=D)` put them. Each step runs the same operations on the same values in the same
order: the outputs and the final state are bit-identical to the loop's (measured on Mamba's tiny models). The scan
takes as many steps as the slices have positions, so export checks each against `N` (`torch._check(X.shape[d] ==
N)`), and `N > 0` (with no step, the loop's `torch.stack([])` raises). Eager keeps the three statements in the `else`
arm.

What it refuses (left unchanged, with a finding): a loop whose index is used otherwise (arithmetic on it, a slice, an
index of a name the loop assigns), whose body holds anything but assignments to names and the final append, whose
names are read after it without carrying its state (their value after the loop is the last step's), that reads `L`
elsewhere, or that binds the names the rewrite introduces; a module that does not `import torch`. A carried name must
keep its shape and dtype from step to step (scan's carry): where it does not, export fails with scan's message.
"""

from __future__ import annotations

from collections import Counter

import libcst as cst
import libcst.matchers as m

from .base import (
    Codemod,
    eager_arm,
    formatted_block,
    imports_torch,
    scoped_outside_export_twins,
    shared_module_refusal,
)
from ._candidates import CandidateStatements
from ._walks import (
    ReplaceNodes,
    candidates_in_statements,
    child_nodes,
    name_values,
    replace_in_statements,
)

STEP, STACKED, SUFFIX = "scan_step", "stacked_steps", "_at_step"

COMMENT = (
    "# one scan over the sequence: torch.export unrolls a Python loop into as many steps as the example has,\n"
    "# and pins the length\n"
)

RANGE_LOOP = m.For(target=m.Name(), iter=m.Call(func=m.Name("range"), args=[m.Arg(value=m.Name(), keyword=None)]))
EMPTY_LIST = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.List(elements=[]))]
)
STACK = m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("stack")))


def _names(node: cst.CSTNode) -> list[str]:
    """Every `Name` read or bound in `node`, with repeats; attribute names (`x.to`) left out."""
    found, pending = [], [node]
    while pending:
        current = pending.pop()
        if type(current) is cst.Name:
            found.append(current.value)
        elif type(current) is cst.Attribute:
            pending.append(current.value)
        else:
            pending.extend(child_nodes(current))
    return found


def _is_full(element: cst.SubscriptElement) -> bool:
    return m.matches(element.slice, m.Slice(lower=None, upper=None, step=None))


def _stack_dim(call: cst.Call, items: str) -> cst.BaseExpression | None:
    """D of `torch.stack(L, dim=D)` (`torch.stack(L, D)`; 0 when not given), None when `call` is not that."""
    args = call.args
    if not args or args[0].keyword is not None or not m.matches(args[0].value, m.Name(items)) or len(args) > 2:
        return None
    if len(args) == 1:
        return cst.Integer("0")
    second = args[1]
    if second.keyword is not None and second.keyword.value != "dim":
        return None
    return second.value if m.matches(second.value, m.Integer() | m.UnaryOperation(expression=m.Integer())) else None


class _Site:
    """`L = []`, the loop and `Y = torch.stack(L, dim=D)` at `block.body[start:start + 3]`."""

    def __init__(self, block: cst.IndentedBlock, start: int, function: cst.FunctionDef, construct: str):
        self.block, self.start, self.function, self.construct = block, start, function, construct
        self.statements = block.body[start : start + 3]
        self.items = self.statements[0].body[0].targets[0].target.value
        self.loop = self.statements[1]

    def plan(self) -> tuple[dict, str | None]:
        """What the export arm needs (or an empty dict), and the reason it cannot be made (or None)."""
        index, count = self.loop.target.value, self.loop.iter.args[0].value.value
        stacked = self.statements[2]
        if not m.matches(stacked, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
            return {}, "the list is not stacked by `Y = torch.stack(L, dim=D)` right after the loop"
        result, call = stacked.body[0].targets[0].target.value, stacked.body[0].value
        dim = _stack_dim(call, self.items) if m.matches(call, STACK) else None
        if dim is None:
            return {}, "the list is not stacked by `Y = torch.stack(L, dim=D)` right after the loop"
        body = self.loop.body.body if isinstance(self.loop.body, cst.IndentedBlock) else ()
        if self.loop.orelse is not None or not body:
            return {}, "the loop has an `else`"
        *steps, last = body
        append = m.SimpleStatementLine(
            body=[
                m.Expr(
                    value=m.Call(
                        func=m.Attribute(value=m.Name(self.items), attr=m.Name("append")), args=[m.Arg(keyword=None)]
                    )
                )
            ]
        )
        assignment = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])
        if not m.matches(last, append) or not all(m.matches(stmt, assignment) for stmt in steps):
            return {}, "the body is not assignments to names, then the append of the step's output"
        assigned = [stmt.body[0].targets[0].target.value for stmt in steps]
        # the carried names: read by the body before it assigns them
        carried, bound = [], set()
        for stmt, target in [*zip(steps, assigned), (last, None)]:
            value = stmt.body[0].value
            for name in _names(value):
                if name in assigned and name not in bound and name not in carried:
                    carried.append(name)
            if target is not None:
                bound.add(target)
        if not carried:
            return {}, None  # no recurrence: not a candidate
        carried.sort(key=assigned.index)
        # each use of the index: one index of a name bound outside the loop, the others full slices
        slices, taken = {}, {}
        for subscript in (node for stmt in body for node in _subscripts(stmt)):
            at = [i for i, element in enumerate(subscript.slice) if m.matches(element.slice, m.Index(m.Name(index)))]
            if len(at) != 1:
                continue
            others = [e for i, e in enumerate(subscript.slice) if i != at[0]]
            tensor = subscript.value.value if type(subscript.value) is cst.Name else None
            if tensor is None or tensor in assigned or not all(map(_is_full, others)):
                return {}, f"`{index}` indexes something other than a tensor bound outside the loop, by itself"
            if taken.setdefault(tensor, at[0]) != at[0]:
                return {}, f"`{tensor}` is indexed by `{index}` along two dims"
            slices[subscript] = tensor
        if sum(name == index for stmt in body for name in _names(stmt)) != len(slices):
            return {}, f"`{index}` is used otherwise than to take a step's slice of a tensor"
        # the loop's names read after it: only the carried ones (the scan returns their last values) and `Y`
        everywhere = Counter(_names(self.function.body))
        here = Counter(name for stmt in self.statements for name in _names(stmt))
        local = {index, self.items} | (set(assigned) - set(carried) - {result})
        read = sorted(name for name in local if everywhere[name] > here[name])
        if read:
            return {}, f"the function reads `{'`, `'.join(read)}` outside the loop"
        introduced = {STEP, STACKED, *(tensor + SUFFIX for tensor in taken)}
        clashes = sorted(introduced & name_values(self.function))
        if clashes:
            return {}, f"the function already uses `{'`, `'.join(clashes)}`"
        plan = {
            "count": count,
            "carried": carried,
            "taken": taken,
            "slices": slices,
            "steps": steps,
            "output": last.body[0].value.args[0].value,
            "result": result,
            "dim": dim,
        }
        return plan, None


def _subscripts(node: cst.CSTNode) -> list[cst.Subscript]:
    """The subscripts in `node`, in source order (the order of the scan's slices)."""
    return list(m.findall(node, m.Subscript()))


def _unpacked(names: list[str]) -> str:
    """The target or value that unpacks `names`: `(a,)` for one, `a, b` for more."""
    return f"({names[0]},)" if len(names) == 1 else ", ".join(names)


def _find(owner: cst.BaseStatement):
    """(the loop, its site) for each `L = []`, `for I in range(N):`, ... in a block of a function in `owner`."""
    found = []
    for block, qualname, functions in scoped_outside_export_twins(owner, (cst.IndentedBlock,)):
        if not functions:
            continue
        body = block.body
        for start in range(len(body) - 2):
            if not m.matches(body[start], EMPTY_LIST) or not m.matches(body[start + 1], RANGE_LOOP):
                continue
            # a candidate: the list stacked by the next statement
            stacks = m.Call(
                func=STACK.func,
                args=[m.Arg(value=m.Name(body[start].body[0].targets[0].target.value)), m.ZeroOrMore()],
            )
            if m.findall(body[start + 2], stacks):
                found.append((body[start + 1], _Site(block, start, functions[-1], qualname)))
    return found


def _loop_test(node: cst.CSTNode) -> bool:
    return type(node) is cst.For and m.matches(node, RANGE_LOOP)


class SequenceScan(Codemod):
    NAME = "sequence-scan"
    DESCRIPTION = (
        "A recurrence stepped in a Python loop over the sequence, its outputs appended and stacked, is one "
        "torch._higher_order_ops.scan under export: export unrolled the loop and pinned the length."
    )

    @classmethod
    def might_apply(cls, source: str) -> bool:
        return "torch.stack(" in source and ".append(" in source and " in range(" in source

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        candidates, owners = candidates_in_statements(tree, _loop_test, _find)
        if not candidates:
            return tree
        statements = CandidateStatements(
            self, tree, [owners[loop] for loop, _ in candidates], [site.function for _, site in candidates]
        )
        shared = shared_module_refusal(self.context.full_module_name)
        has_torch = imports_torch(tree)
        indent = len(tree.default_indent)
        blocks: dict[cst.IndentedBlock, list] = {}
        for loop, site in candidates:
            line, depth = statements.line(loop), statements.column(loop) // indent
            plan, reason = site.plan()
            if not plan and reason is None:
                continue
            if reason is None and shared is not None:
                reason = shared
            elif reason is None and not has_torch:
                reason = "the module does not `import torch`"
            if reason is not None:
                self.report(line, "refused", site.construct, reason)
                continue
            blocks.setdefault(site.block, []).append((site, self._twin(site, plan, depth, indent)))
            carried = ", ".join(f"`{name}`" for name in plan["carried"])
            self.report(
                line, "rewritten", site.construct, f"one scan over the sequence under export, carrying {carried}"
            )
        replacements = {}
        for block, twins in blocks.items():
            body = list(block.body)
            for site, twin in sorted(twins, key=lambda pair: -pair[0].start):
                body[site.start : site.start + 3] = [twin]
            replacements[block] = block.with_changes(body=body)
        return replace_in_statements(
            tree, replacements, {id(owners[loop]): owners[loop] for loop, _ in candidates}.values()
        )

    @staticmethod
    def _twin(site: _Site, plan: dict, depth: int, indent: int) -> cst.If:
        code = cst.Module(body=[]).code_for_node
        carried, listed = _unpacked(plan["carried"]), ", ".join(plan["carried"])
        taken = list(plan["taken"].items())
        renamed = {node: cst.Name(tensor + SUFFIX) for node, tensor in plan["slices"].items()}
        steps = [code(stmt.visit(ReplaceNodes(renamed))).strip("\n") for stmt in plan["steps"]]
        output = code(plan["output"].visit(ReplaceNodes(renamed)))
        count, dim = plan["count"], code(plan["dim"])
        lines = [
            "if torch.compiler.is_exporting():",
            *("    " + line for line in COMMENT.splitlines()),
            "    from torch._higher_order_ops.scan import scan",
            "",
            f"    def {STEP}(carry, steps):",
            f"        {carried} = carry",
            f"        {_unpacked([tensor + SUFFIX for tensor, _ in taken])} = steps",
            *("        " + line for step in steps for line in step.splitlines()),
            f"        return [{listed}], {output}",
            "",
            *(f"    torch._check({tensor}.shape[{at}] == {count})" for tensor, at in taken),
            f"    torch._check({count} > 0)",
            f"    {carried if len(plan['carried']) == 1 else f'({listed})'}, {STACKED} = scan({STEP}, [{listed}], "
            f"[{', '.join(f'{tensor}.movedim({at}, 0)' for tensor, at in taken)}])",
            f"    {plan['result']} = {STACKED}" + ("" if dim == "0" else f".movedim(0, {dim})"),
            "else:",
            "    pass",
        ]
        twin = cst.parse_statement("\n".join(lines) + "\n")
        export = formatted_block(list(twin.body.body), depth + 1, indent).body
        first, *rest = site.statements
        eager = eager_arm([first.with_changes(leading_lines=()), *rest], depth + 1, indent)
        orelse = twin.orelse.with_changes(body=twin.orelse.body.with_changes(body=eager))
        return twin.with_changes(
            leading_lines=first.leading_lines, body=twin.body.with_changes(body=export), orelse=orelse
        )
