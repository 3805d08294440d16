"""Is a dump an optimization of a model? ORT's optimized model keeps the model's interface (graph inputs and
outputs, by name and element type; overrides may pin their dims) and the weights it did not rewrite (same name,
same dims and dtype; fusions add new ones and drop the ones they replaced). A dump of another model, another
export of it, or another size of it fails one of these, and linting it against MODEL would judge the wrong graph.
"""

from __future__ import annotations

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
    return None
