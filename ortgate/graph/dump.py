"""Is a dump an optimization of a model? ORT's optimized model keeps the model's interface (graph inputs and
outputs, by name and element type; overrides may pin their dims) and the weights it did not rewrite (same name,
same dims and dtype; fusions add new ones and drop the ones they replaced). A dump of another model, another
export of it, or another size of it fails one of these, and linting it against MODEL would judge the wrong graph.

A sibling export (another model of the same family: same interface, the same weight names with the same dims for
what both have) passes those; what gives it away is weights the model does not have. ORT makes new weights only out
of the model's own: a folded constant (named after the value it replaces), a copy for another device
(`FusedBack_<name>`), a transposed or packed weight replacing the ones it was made from, a Constant node's value.
So the float weights of the dump that are not the model's (nor a copy of one, nor a Constant node's value) may hold no more elements than the model's float weights the
dump dropped (a folded constant counts too: it is made of what it replaced).
"""

from __future__ import annotations

from math import prod

from ortgate.graph.index import Graph

MAX_NAMED = 3  # names quoted in the message


def _names(names) -> str:
    names = sorted(names)
    shown = ", ".join(repr(n) for n in names[:MAX_NAMED])
    return shown + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")


def optimization_mismatch(model: Graph, dump: Graph) -> str | None:
    """Why `dump` is not an optimization of `model`, or None when it can be."""
    for what, mine, theirs in (("inputs", model.input_infos, dump.input_infos),
                               ("outputs", model.output_infos, dump.output_infos)):
        have = {v.name: v.dtype for v in theirs}
        want = {v.name: v.dtype for v in mine}
        if set(have) != set(want):
            missing, extra = set(want) - set(have), set(have) - set(want)
            parts = [f"lacks the model's {_names(missing)}" if missing else "",
                     f"has {_names(extra)} the model does not" if extra else ""]
            return f"its graph {what} differ from the model's: it {' and '.join(p for p in parts if p)}"
        typed = [n for n in want if want[n] and have[n] and want[n] != have[n]]
        if typed:
            name = typed[0]
            return f"{what[:-1]} {name!r} is {have[name]} in the dump but {want[name]} in the model"
    shared = model.initializers.keys() & dump.initializers.keys()
    if model.initializers and dump.initializers and not shared:
        return (f"it has no initializer in common with the model ({len(dump.initializers)} in the dump, "
                f"{len(model.initializers)} in the model: another export, or another model)")
    for name in sorted(shared):
        a, b = model.initializers[name], dump.initializers[name]
        if a.dims != b.dims or a.dtype != b.dtype:
            return (f"initializer {name!r} is {list(b.dims)} {b.dtype} in the dump but {list(a.dims)} {a.dtype} in "
                    "the model (another size of the model?)")
    return _foreign_weights(model, dump)


# Element types of weights (as Initializer.dtype names them): what a sibling model's extra layers are made of.
_FLOAT_TYPES = frozenset({"float", "float16", "bfloat16", "double", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
                          "float8e5m2fnuz"})
_COPY_PREFIX = "FusedBack_"  # ORT's copy of an initializer for a node placed on another device


def _foreign_weights(model: Graph, dump: Graph) -> str | None:
    """The dump's float weights ORT could not have made from the model's, or None (see the module's docstring)."""
    def floats(graph: Graph):
        return {n: t for n, t in graph.initializers.items() if t.dtype in _FLOAT_TYPES}

    mine, theirs = floats(model), floats(dump)
    dropped = sum(prod(t.dims) for n, t in mine.items() if n not in dump.initializers)

    def own(name: str) -> bool:  # the model's initializer, ORT's copy of one, or a Constant node's value
        producer = model.producer(name)
        return (name in model.initializers or name.removeprefix(_COPY_PREFIX) in model.initializers
                or (producer is not None and producer.op_type == "Constant"))

    new = {n: t for n, t in theirs.items() if not own(n)}
    made = sum(prod(t.dims) for t in new.values())
    if made <= dropped:
        return None
    largest = sorted(new.values(), key=lambda t: (-prod(t.dims), t.name))
    shown = ", ".join(f"{t.name!r} {list(t.dims)} {t.dtype}" for t in largest[:MAX_NAMED])
    more = f" and {len(largest) - MAX_NAMED} more" if len(largest) > MAX_NAMED else ""
    return (f"it holds weights the model does not have ({shown}{more}: {made:,} elements, where the model's weights "
            f"the dump dropped hold {dropped:,}); ORT makes weights only out of the model's own (another export of a "
            "sibling model?)")
