"""Generate ortgate/knowledge/op_contracts.json: what each operator accepts, from the references ORT documents.

    python scripts/gen_op_contracts.py [--contrib PATH/ContribOperators.md] [--check]

- com.microsoft ops: parsed from ONNX Runtime's ContribOperators.md (the copy beside the reference notes; its commit
  is read from SOURCE_COMMIT.txt there): inputs (required / optional / variadic) and outputs, their type
  constraints (which give an output's element type where the graph declares none), the ranks
  an input's description states ("3D tensor with shape ... or 4D ..."), attributes (required, type) and the values
  an attribute's description enumerates ("Choose from relu, gelu ...", "Supported values are 2, 4, and 8").
- ai.onnx ops: every schema version from ONNX's own registry (onnx.defs) of the installed onnx package: inputs,
  outputs, type constraints, attributes. ONNX schemas state no ranks; none are recorded.
- ORT's own ai.onnx-domain ops (SimplifiedLayerNormalization, ...), documented only by their kernel registrations
  (OperatorKernels.md, as ortgate/knowledge/kernels.json holds it): input element types; nothing else is checked.

The linter reads this file through ortgate.knowledge.contracts; an op that is not in it is "not checked".

Per release (`--releases`): ortgate/knowledge/op_schemas.json, which com.microsoft ops, inputs and attributes each
ONNX Runtime release defines and which of those ops have a CPU kernel, read from the wheels themselves (each
release's registered schemas, `get_all_operator_schema()`, and on CPU wheels `get_all_opkernel_def()`), with the
range of releases each holds for:

    pip download onnxruntime==1.20.0 ... onnxruntime==1.32.0 --no-deps -d WHEELS
    python scripts/gen_op_contracts.py --releases WHEELS/onnxruntime-*.whl GPU_PYTHON
    # GPU_PYTHON: a Python with onnxruntime-gpu installed (its schemas only: listing its kernels needs CUDA)
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "ortgate" / "knowledge" / "op_contracts.json"
# the reference notes live in shared/ beside the repository (or beside the folder of worktrees)
DEFAULT_REFERENCE = next((p / "shared" / "reference" / "onnxruntime" for p in (REPO.parent, REPO.parent.parent)
                          if (p / "shared" / "reference" / "onnxruntime").is_dir()), REPO.parent / "shared")
# ai.onnx versions older than this are not recorded (no LLM exporter writes them); a model at such an opset is
# "not checked" for the ops whose schema changed since.
MIN_ONNX_SINCE = 7

_HEADER = re.compile(r'^### <a name="(com\.microsoft)\.([A-Za-z0-9_]+)"></a>')
_SINCE = re.compile(r"available since version (\d+) of the '([^']+)' operator set")
_DT = re.compile(r"^<dt><tt>([^<]+)</tt>(.*?)</dt>$")
_RANK = re.compile(r"\b([0-6])[- ]?D\b")
_CHOOSE = re.compile(r"(?:Choose from|Supported values are|Must be one of)\s+([^.]+)\.", re.IGNORECASE)

_ATTR_TYPES = {
    "int": "INT", "float": "FLOAT", "string": "STRING", "tensor": "TENSOR", "graph": "GRAPH",
    "list of ints": "INTS", "list of floats": "FLOATS", "list of strings": "STRINGS", "list of tensors": "TENSORS",
    "list of graphs": "GRAPHS", "sparse tensor": "SPARSE_TENSOR",
}


def _text(dd: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", dd)).strip()


def _enumeration(description: str, attr_type: str) -> list | None:
    m = _CHOOSE.search(description)
    if not m or attr_type not in ("INT", "STRING"):
        return None
    words = re.split(r",\s*(?:and|or)?\s*|\s+(?:and|or)\s+", m.group(1))
    values = [w.replace("(default)", "").strip().strip("'\"` ") for w in words]
    values = [v for v in values if v]
    if attr_type == "INT":
        if not all(re.fullmatch(r"-?\d+", v) for v in values):
            return None
        return [int(v) for v in values]
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) for v in values):
        return None
    return values


def _ranks(description: str) -> list[int] | None:
    """Ranks an input's description states, when it starts by stating one ("2D tensor ...", "3D or 4D ...")."""
    head = description.lstrip()
    if not re.match(r"^(?:[Aa]n? )?(?:optional )?[0-6][- ]?D\b", head):
        return None
    return sorted({int(r) for r in _RANK.findall(head)})


def parse_contrib(text: str) -> dict[str, dict]:
    ops: dict[str, dict] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _HEADER.match(lines[i])
        if not m:
            i += 1
            continue
        name = m.group(2)
        j = i + 1
        while j < len(lines) and not _HEADER.match(lines[j]):
            j += 1
        section = lines[i:j]
        i = j
        op = {"since": None, "inputs": [], "outputs": [], "attributes": {}, "types": {}}
        part = None
        k = 0
        while k < len(section):
            line = section[k].strip()
            s = _SINCE.search(line)
            if s:
                op["since"] = int(s.group(1))
            if line.startswith("#### "):
                title = line[5:].lower()
                part = ("attributes" if title.startswith("attributes") else "inputs" if title.startswith("inputs")
                        else "outputs" if title.startswith("outputs") else "types" if title.startswith("type constraints")
                        else None)
            d = _DT.match(line)
            if d and part:
                term, rest = d.group(1), d.group(2)
                dd = section[k + 1].strip() if k + 1 < len(section) else ""
                description = _text(dd) if dd.startswith("<dd>") else ""
                if part == "attributes":
                    kind_text = rest.split(":", 1)[1].strip() if ":" in rest else ""
                    required = "(required)" in kind_text
                    kind_text = kind_text.replace("(required)", "").strip()
                    attr_type = _ATTR_TYPES.get(kind_text)
                    entry = {"type": attr_type, "required": required}
                    values = _enumeration(description, attr_type or "")
                    if values:
                        entry["values"] = values
                        entry["values_text"] = description
                    op["attributes"][term] = entry
                elif part in ("inputs", "outputs"):
                    before, _, type_str = rest.partition(":")
                    flags = before.strip()
                    entry = {"name": term, "type": type_str.strip(),
                             "option": "variadic" if "variadic" in flags else "optional" if "optional" in flags
                             else "single"}
                    if part == "inputs":
                        ranks = _ranks(description)
                        if ranks:
                            entry["ranks"] = ranks
                            entry["ranks_text"] = description
                    op[part].append(entry)
                elif part == "types":
                    allowed = re.findall(r"tensor\(([a-z0-9]+)\)", rest)
                    op["types"][term] = sorted(set(allowed))
            k += 1
        ops[name] = op  # a later section of the same name (a newer version) replaces the earlier
    return ops


def onnx_schemas() -> dict[str, list[dict]]:
    from onnx import defs

    out: dict[str, list[dict]] = {}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain not in ("", "ai.onnx") or schema.deprecated:
            continue
        if schema.since_version < MIN_ONNX_SINCE and any(
                s.name == schema.name and MIN_ONNX_SINCE > s.since_version > schema.since_version
                for s in defs.get_all_schemas_with_history() if s.domain == schema.domain):
            continue  # an older version superseded before MIN_ONNX_SINCE

        def formal(p) -> dict:
            option = {0: "single", 1: "optional", 2: "variadic"}[int(p.option.value)]
            return {"name": p.name, "type": p.type_str, "option": option}

        attributes = {name: {"type": a.type.name, "required": bool(a.required)} for name, a in schema.attributes.items()}
        types = {c.type_param_str: sorted({t[len("tensor("):-1] for t in c.allowed_type_strs if t.startswith("tensor(")})
                 for c in schema.type_constraints}
        out.setdefault(schema.name, []).append({
            "since": schema.since_version,
            "inputs": [formal(p) for p in schema.inputs],
            "outputs": [formal(p) for p in schema.outputs],
            "attributes": attributes,
            "types": types,
        })
    for versions in out.values():
        versions.sort(key=lambda v: v["since"])
    return out


def kernel_only_ops(known: set[str]) -> dict[str, dict]:
    """ai.onnx-domain ops ORT registers itself (SimplifiedLayerNormalization, ...), documented only by their kernel
    registrations (OperatorKernels.md, as knowledge/kernels.json holds it): input names and element types, the
    union over providers. Whether an input is optional and which attributes exist is not documented: not checked."""
    data = json.loads((REPO / "ortgate" / "knowledge" / "kernels.json").read_text())
    out: dict[str, dict] = {}
    for domains in data["providers"].values():
        for op_type, entry in domains.get("ai.onnx", {}).items():
            if op_type in known:
                continue
            op = out.setdefault(op_type, {"since": 1, "inputs": [], "attributes": {}, "types": {}})
            for signature in entry.get("signatures", [])[:1]:
                if not op["inputs"]:
                    op["inputs"] = [{"name": i["name"], "type": i["constraint"], "option": "unknown"}
                                    for i in signature["inputs"]]
            for kernel in entry.get("kernels", []):
                for param, types in kernel.get("types", {}).items():
                    op["types"][param] = sorted(set(op["types"].get(param, [])) | set(types))
    return {op: [v] for op, v in sorted(out.items())}


def generate(contrib_path: Path) -> dict:
    import onnx

    commit_file = contrib_path.parent / "SOURCE_COMMIT.txt"
    commit = None
    if commit_file.exists():
        m = re.search(r"ContribOperators\.md\s+at commit ([0-9a-f]{40})", commit_file.read_text())
        commit = m.group(1) if m else None
    contrib = parse_contrib(contrib_path.read_text(encoding="utf-8"))
    schemas = onnx_schemas()
    kernels = json.loads((REPO / "ortgate" / "knowledge" / "kernels.json").read_text())
    return {
        "schema": 1,
        "about": "What each operator accepts (required inputs and attributes, input types, documented ranks and "
                 "attribute values) and the types of its outputs, generated by scripts/gen_op_contracts.py; do not edit.",
        "sources": {
            "com.microsoft": f"onnxruntime docs/ContribOperators.md at commit {commit}" if commit
            else "onnxruntime docs/ContribOperators.md",
            "ai.onnx": f"onnx {onnx.__version__} onnx.defs (schemas since opset version {MIN_ONNX_SINCE})",
            "ai.onnx-kernels": f"onnxruntime docs/OperatorKernels.md at commit {kernels.get('commit')} (ORT's own "
            "ai.onnx-domain ops: input element types only)",
        },
        "com.microsoft": dict(sorted(contrib.items())),
        "ai.onnx": dict(sorted(schemas.items())),
        "ai.onnx-kernels": kernel_only_ops(set(schemas)),
    }


RELEASES_OUT = REPO / "ortgate" / "knowledge" / "op_schemas.json"

# Run inside the release's own Python: its com.microsoft schemas, its ai.onnx opset, its CPU kernels.
_DUMP = r"""
import json, sys
import onnxruntime
from onnxruntime.capi import onnxruntime_pybind11_state as C
kernels = sys.argv[1] == "1"
ops, opset = {}, 0
for s in C.get_all_operator_schema():
    if s.domain == "":
        opset = max(opset, s.since_version)
    if s.domain != "com.microsoft":
        continue
    if s.name in ops and ops[s.name]["since"] > s.since_version:
        continue
    ops[s.name] = {"since": s.since_version,
                   "inputs": [[i.name, str(i.option).split(".")[-1]] for i in s.inputs],
                   "attributes": {a: str(v.type).split(".")[-1] for a, v in s.attributes.items()}}
cpu = []
if kernels:
    cpu = sorted({k.op_name for k in C.get_all_opkernel_def()
                  if k.domain == "com.microsoft" and k.provider == "CPUExecutionProvider"})
# The newest ai.onnx opset a model may import: a one-Identity model per opset (ORT refuses a model stamped with an
# opset it calls under development at load, which the newest schema's version does not tell).
from onnx import TensorProto, helper
onnxruntime.set_default_logger_severity(4)
loads = 0
for stamp in range(opset - 2, opset + 3):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", stamp)])
    try:
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        loads = stamp
    except Exception:
        break
print(json.dumps({"version": onnxruntime.__version__, "device": onnxruntime.get_device(), "opset": opset,
                  "max_model_opset": loads,
                  "ops": ops, "cpu_kernels": cpu}))
"""


def dump_release(source: str) -> tuple[str, dict]:
    """One release's dump: from a wheel (unpacked beside this Python's numpy) or from another Python."""
    import subprocess
    import tempfile
    import zipfile

    if source.endswith(".whl"):
        with tempfile.TemporaryDirectory() as tmp:
            zipfile.ZipFile(source).extractall(tmp)
            done = subprocess.run([sys.executable, "-c", _DUMP, "1"], capture_output=True, text=True, check=True,
                                  env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"}, cwd=tmp)
        package = Path(source).name.split("-")[0].replace("_", "-")
        label = Path(source).name
    else:
        done = subprocess.run([source, "-c", _DUMP, "0"], capture_output=True, text=True, check=True)
        package, label = "onnxruntime-gpu", f"{source} (onnxruntime-gpu)"
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return package, {**data, "wheel": label}


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])


def _spans(present: list[str], order: list[str]) -> list[list[str]]:
    """The releases an item is in, as [first, last] runs over the covered releases in order."""
    runs: list[list[str]] = []
    for i, version in enumerate(order):
        if version not in present:
            continue
        if runs and order.index(runs[-1][1]) == i - 1:
            runs[-1][1] = version
        else:
            runs.append([version, version])
    return runs


def generate_releases(sources: list[str]) -> dict:
    dumps: dict[str, dict] = {}
    gpu: dict[str, dict] = {}
    for source in sources:
        package, data = dump_release(source)
        (gpu if package == "onnxruntime-gpu" else dumps)[data["version"]] = data
    order = sorted(dumps, key=_key)
    ops: dict[str, dict] = {}
    for name in sorted({op for d in dumps.values() for op in d["ops"]}):
        having = [v for v in order if name in dumps[v]["ops"]]
        inputs: dict[str, list[str]] = {}
        attrs: dict[str, list[str]] = {}
        positions: dict[str, int] = {}
        for v in having:
            schema = dumps[v]["ops"][name]
            for i, (formal, _option) in enumerate(schema["inputs"]):
                inputs.setdefault(formal, []).append(v)
                positions[formal] = i
            for attr in schema["attributes"]:
                attrs.setdefault(attr, []).append(v)
        ops[name] = {
            "releases": _spans(having, order),
            "inputs": {f: {"position": positions[f], "releases": _spans(vs, order)}
                       for f, vs in sorted(inputs.items(), key=lambda kv: positions[kv[0]])},
            "attributes": {a: _spans(vs, order) for a, vs in sorted(attrs.items())},
            "cpu_kernel": _spans([v for v in order if name in dumps[v]["cpu_kernels"]], order),
            "variadic": any(option == "Variadic" for v in having for _f, option in dumps[v]["ops"][name]["inputs"]),
        }
    gpu_diff = {}
    for version, data in gpu.items():
        cpu = dumps.get(version, {"ops": {}})
        gpu_diff[version] = {
            "wheel": "onnxruntime-gpu " + version,
            "ops_not_in_cpu_wheel": sorted(set(data["ops"]) - set(cpu["ops"])),
            "ops_only_in_cpu_wheel": sorted(set(cpu["ops"]) - set(data["ops"])),
            "attributes_differ": sorted(
                op for op in set(data["ops"]) & set(cpu["ops"])
                if set(data["ops"][op]["attributes"]) != set(cpu["ops"][op]["attributes"])
                or [i[0] for i in data["ops"][op]["inputs"]] != [i[0] for i in cpu["ops"][op]["inputs"]]),
        }
    return {
        "schema": 1,
        "generated_by": "scripts/gen_op_contracts.py --releases",
        "about": ("The com.microsoft ops, inputs and attributes each ONNX Runtime CPU release registers, and which of "
                  "those ops have a CPU kernel, read from each release's wheel (get_all_operator_schema, "
                  "get_all_opkernel_def). Each item lists the runs [first, last] of covered releases it is in."),
        "releases": {v: {"wheel": dumps[v]["wheel"], "onnx_opset": dumps[v]["opset"],
                         "max_model_opset": dumps[v]["max_model_opset"]} for v in order},
        "gpu_wheels": gpu_diff,
        "ops": ops,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contrib", type=Path, default=DEFAULT_REFERENCE / "ContribOperators.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file differs from what this writes")
    ap.add_argument("--releases", nargs="+", metavar="WHEEL_OR_PYTHON",
                    help="write op_schemas.json from these onnxruntime wheels (and onnxruntime-gpu Pythons)")
    args = ap.parse_args()
    if args.releases:
        text = json.dumps(generate_releases(args.releases), indent=1, sort_keys=False) + "\n"
        RELEASES_OUT.write_text(text)
        print(f"wrote {RELEASES_OUT} ({len(text)} bytes)")
        return 0
    if not args.contrib.exists():
        print(f"gen_op_contracts: {args.contrib}: not found (pass --contrib)", file=sys.stderr)
        return 2
    text = json.dumps(generate(args.contrib), indent=1, sort_keys=False) + "\n"
    if args.check:
        return 0 if OUT.exists() and OUT.read_text() == text else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
