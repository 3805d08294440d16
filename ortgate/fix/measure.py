"""Original vs fixed, measured with the runner on ORT's CPU provider: one decode step, the same synthesised inputs,
buffers bound once (the runner's BoundSession), both sessions timed in alternated rounds: p50 latency of each, and
their ratio with its spread over the rounds (within noise when the rounds' p50 intervals overlap)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from ortgate.evidence import Ratio, Stats
from ortgate.graph.index import Graph
from ortgate.graph.patterns.decoder import token_ids_input
from ortgate.runner.inputs import (
    dim_role,
    graph_dim_roles,
    graph_signature,
    head_size,
    resolve_dims,
    sliding_window,
    synthesize,
    token_inputs,
)
from ortgate.runner.measure import (
    BoundSession,
    Deadline,
    alternated_rounds,
    latency_stats,
    plan_binding,
    round_ratio,
    timed_runs,
)
from ortgate.runner.session import CPU, captured_output, tidy
from ortgate.runner.settings import RunnerSettings

DECODE = RunnerSettings(batch_size=1, sequence_length=1, past_sequence_length=16, warmup=3, iterations=20)


@dataclass
class Measurement:
    original: Stats | None  # None: not measured (note says why)
    fixed: Stats
    step: str  # what one run is
    note: str | None = None
    batch_size: int = 1  # the step's shape, for an estimate of the same step
    new_tokens: int = 1
    context: int = 1  # tokens the step attends to: the cached ones and its own
    ratio: Ratio | None = None  # original p50 / fixed p50 over the alternated rounds

    @property
    def speedup(self) -> float | None:
        if self.ratio is not None:
            return self.ratio.value
        if self.original is None or self.fixed.p50_ms <= 0:
            return None
        return self.original.p50_ms / self.fixed.p50_ms


def decode_step(graph: Graph, settings: RunnerSettings = DECODE):
    """The step measure_pair times: the graph's inputs, their dims, and the step shape they describe. A token input
    whose batch or sequence dim is a literal (an export fixed to its example's shape, [batch, 7]) is fed at that
    size, so that is the step's shape, not the settings' one new token."""
    signature = graph_signature(graph)
    dims, step = resolve_dims(signature, settings, {}, window=sliding_window(graph, None), head=head_size(None, None),
                              policy_file=None, roles=graph_dim_roles(graph))
    tokens = token_ids_input(graph)
    if tokens is not None and tokens.shape is not None and len(tokens.shape) == 2:
        batch, seq = (d if isinstance(d, int) and d > 0 else None for d in tokens.shape)
        new_tokens = seq or step.new_tokens
        step = replace(step, batch=batch or step.batch, new_tokens=new_tokens, context=step.past + new_tokens)
    return signature, dims, step


def measure_pair(original: onnx.ModelProto, original_dir: Path, fixed_path: Path, graph: Graph,
                 settings: RunnerSettings = DECODE, *, skip_original: str | None = None) -> Measurement:
    """`skip_original`: why the original is not timed (a graph ORT cannot build a session of in reasonable time)."""
    signature, dims, step = decode_step(graph, settings)
    feeds = synthesize(signature, dims, step, token_inputs(graph, None))
    runs = [(str(fixed_path), fixed_path.parent)]
    labels = ["fixed"]
    if not skip_original:
        runs.insert(0, (original.SerializeToString(), original_dir))
        labels.insert(0, "original")
    bounds = []
    with Deadline(None) as deadline:
        for (model, folder), label in zip(runs, labels):
            bound = BoundSession(_session(model, folder), plan_binding(CPU, {}), feeds)
            bound.discover_outputs()
            timed_runs(bound, settings.warmup, 0, deadline, label=label)
            bounds.append(bound)
        latencies = alternated_rounds(bounds, settings.iterations, deadline, labels=labels)
    del bounds
    stats = [latency_stats([x for r in rounds for x in r]) for rounds in latencies]
    roles = graph_dim_roles(graph)
    past = f" after {step.past} cached" if any((roles.get(d) or dim_role(d)) == "past" for d in dims) else ""
    what = (f"one step of {step.batch} x {step.new_tokens} new token(s){past}, p50 of {stats[-1].iterations} "
            f"runs{' each, alternated' if len(stats) > 1 else ''}, ORT CPU, ORT_ENABLE_ALL")
    if skip_original:
        return Measurement(None, stats[0], what, skip_original, step.batch, step.new_tokens, step.context)
    return Measurement(stats[0], stats[1], what, None, step.batch, step.new_tokens, step.context,
                       ratio=round_ratio(latencies[0], latencies[1]))


def _session(model, folder: Path):
    import onnxruntime as ort

    from ortgate.errors import InputError

    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    with captured_output():
        try:
            return ort.InferenceSession(model, options, providers=[CPU])
        except Exception as exc:
            raise InputError(f"ONNX Runtime cannot load the model to measure it: {tidy(str(exc))}", folder) from None
