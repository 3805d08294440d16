"""How much does `ortgate run`'s timing harness add to a step? Target: runner / bare <= 1.03.

Builds ONE session from the policy (exactly as `ortgate run` does), synthesises the inputs the same way, then
alternates blocks of (a) the runner's timed loop (IOBinding to fixed buffers, deadline check, per-run clock),
(b) a bare `session.run(None, feeds)` loop with numpy inputs on the same session and (c) a bare loop over the
runner's own binding, and prints the median per-iteration time of each: runner / (b) is the ratio asked for
(the runner also saves (b)'s per-run output allocation), runner / (c) is the timing loop's own cost. Tiny models are the hardest case: their step is short, so any
per-iteration cost of the harness shows.

    python benchmarks/runner_overhead.py                       # the shipped tiny example
    python benchmarks/runner_overhead.py MODEL --policy P.yaml --iterations 500 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET = 1.03


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(REPO / "examples" / "qwen3-moe-tiny-fused"))
    parser.add_argument("--policy", default=str(REPO / "policies" / "tiny-moe-cpu.yaml"))
    parser.add_argument("--iterations", type=int, default=300, help="runs per block")
    parser.add_argument("--rounds", type=int, default=5, help="alternating blocks of each loop")
    parser.add_argument("--allow-cpu", action="store_true", help="run a GPU policy's config on CPU")
    args = parser.parse_args(argv)

    from ortgate.config.deployment import setup_from_policy
    from ortgate.engine.pipeline import LintRequest, load_inputs
    from ortgate.runner import session as rs
    from ortgate.runner.collect import _feeds
    from ortgate.runner.measure import GPU_GRAPH_ID_KEY, GRAPH_ID_SKIP, BoundSession, Deadline, plan_binding, timed_runs
    from ortgate.runner.settings import runner_settings

    inputs = load_inputs(LintRequest(args.model, args.policy))
    setup = inputs.deployment.policy_setup or setup_from_policy(inputs.policy)
    requested = setup.provider_name or rs.CPU
    available, reason = rs.provider_availability(requested)
    if not available and not args.allow_cpu:
        print(f"{requested} is not available here ({reason}); pass --allow-cpu", file=sys.stderr)
        return 2
    provider = None if available else rs.CPU
    built = rs.create_session(inputs.model.path, setup, provider=provider)
    session = built.session
    settings = runner_settings(inputs.policy)
    feeds = _feeds(inputs, setup, settings, session)
    ran = session.get_providers()[0]
    plan = plan_binding(ran, session.get_provider_options().get(ran, {}))
    bound = BoundSession(session, plan, feeds)
    bound.discover_outputs()
    numpy_feeds = dict(feeds.arrays)
    deadline = Deadline(None)

    def runner_block() -> float:
        return statistics.median(timed_runs(bound, 0, args.iterations, deadline))

    def bare_binding_block() -> float:
        run, clock, times = bound.run, time.perf_counter, []
        for _ in range(args.iterations):
            start = clock()
            run()
            times.append(clock() - start)
        return statistics.median(times)

    import onnxruntime as ort

    bare_options = ort.RunOptions()
    # A CUDA-graph session must not capture transient session.run buffers: the bare loop runs uncaptured.
    bare_options.add_run_config_entry(GPU_GRAPH_ID_KEY, str(GRAPH_ID_SKIP))

    def bare_block() -> float:
        run, clock, times = session.run, time.perf_counter, []
        for _ in range(args.iterations):
            start = clock()
            run(None, numpy_feeds, bare_options)
            times.append(clock() - start)
        return statistics.median(times)

    for _ in range(max(args.iterations // 10, 3)):  # warm both paths
        bound.run()
        session.run(None, numpy_feeds, bare_options)
    runner_times, bare_times, binding_times = [], [], []
    for _ in range(args.rounds):
        runner_times.append(runner_block())
        bare_times.append(bare_block())
        binding_times.append(bare_binding_block())
    runner_ms = statistics.median(runner_times) * 1000
    bare_ms = statistics.median(bare_times) * 1000
    binding_ms = statistics.median(binding_times) * 1000
    ratio = runner_ms / bare_ms
    print(f"model    {inputs.model.path} on {ran} ({plan.device_type}, cuda graph {'on' if plan.cuda_graph else 'off'})")
    print(f"runner   {runner_ms:.4f} ms per iteration (median of {args.rounds} blocks x {args.iterations} runs)")
    print(f"bare     {bare_ms:.4f} ms per iteration (session.run with numpy inputs, same session)")
    print(f"binding  {binding_ms:.4f} ms per iteration (bare run_with_iobinding loop on the runner's binding)")
    print(f"ratio    {ratio:.3f} runner / bare session.run (target <= {TARGET}) "
          f"{'OK' if ratio <= TARGET else 'ABOVE TARGET'}")
    print(f"harness  {runner_ms / binding_ms:.3f} runner / bare binding loop (the loop's own cost)")
    if plan.cuda_graph:
        print("note     the runner replays a CUDA graph, the bare session.run loop cannot: use a policy with "
              "enable_cuda_graph \"0\" to compare like with like")
    return 0


if __name__ == "__main__":
    sys.exit(main())
