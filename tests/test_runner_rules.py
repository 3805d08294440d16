"""Runtime rules (OGR) on run evidence: what the session did, these findings.

Evidence that a CPU-only machine cannot produce for real (a CUDA session that fell back, a CUDA option the
session reports differently, nodes placed on CPU in a CUDA session) is written out as the runner records it.
"""

from __future__ import annotations

from ortgate.engine.pipeline import LintRequest, load_inputs, run_rules
from ortgate.evidence import (
    Correctness,
    DimCheck,
    DumpEvidence,
    Measurement,
    OptionCheck,
    OutputComparison,
    ProviderCheck,
    RunEvidence,
    SessionEvidence,
    Stats,
)
from ortgate.findings import Location, Severity
from ortgate.rules import all_rules, find_rule
from ortgate.rules.context import EVIDENCE_KEY
from tests.conftest import EXPORTED

MODEL = EXPORTED / "genai-qwen3_5_moe-fp32-cpu" / "model.onnx"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
CUDA_POLICY = "name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n  options: {enable_cuda_graph: '1'}\n"
WHERE = Location("policy.yaml", 3, "execution_provider.name")


def run_rule(rule: str, session: SessionEvidence, write_policy, policy_text=CUDA_POLICY, **evidence):
    inputs = load_inputs(LintRequest(str(MODEL), str(write_policy(policy_text))))
    inputs = inputs.with_evidence(EVIDENCE_KEY, RunEvidence(str(MODEL), "policy.yaml", session, **evidence))
    return run_rules(inputs, [find_rule(rule)])


def cuda_session(ran_on=(CUDA, CPU), **kwargs) -> SessionEvidence:
    return SessionEvidence(ProviderCheck(CUDA, WHERE, True, ran_on=tuple(ran_on), **kwargs))


def measurement(p50_ms=10.0, device="NVIDIA H100 80GB HBM3", kind="gpu") -> Measurement:
    stats = Stats(3, p50_ms, p50_ms, p50_ms, p50_ms, p50_ms, p50_ms)
    return Measurement("policy", CUDA, device, kind, 1, 1, 1, stats, 1000.0 / p50_ms)


def test_no_evidence_no_runtime_findings(write_policy):
    inputs = load_inputs(LintRequest(str(MODEL), str(write_policy(CUDA_POLICY))))
    rules = [r for r in all_rules() if r.family == "runtime"]
    assert len(rules) >= 9
    assert run_rules(inputs, rules) == []


def test_ep_fallback_quotes_the_ep_error(write_policy):
    session = cuda_session(ran_on=(CPU,), fallback_reason="EP Error: unknown option cuda_graph_enable_partial")
    [found] = run_rule("ep-fallback", session, write_policy)
    assert found.severity is Severity.ERROR and found.location == WHERE
    assert "runs on CPUExecutionProvider although the policy asks for CUDAExecutionProvider" in found.message
    assert "cuda_graph_enable_partial" in found.message


def test_no_fallback_when_the_session_runs_on_the_requested_provider(write_policy):
    assert run_rule("ep-fallback", cuda_session(), write_policy) == []


def test_ep_unavailable_is_an_error_unless_cpu_was_allowed(write_policy):
    unavailable = SessionEvidence(ProviderCheck(CUDA, WHERE, False, "libcublasLt.so.13: cannot open"))
    [found] = run_rule("ep-unavailable", unavailable, write_policy)
    assert found.severity is Severity.ERROR and "libcublasLt.so.13" in found.message
    substituted = SessionEvidence(ProviderCheck(CUDA, WHERE, False, "no GPU", (CPU,), substituted=True))
    assert run_rule("ep-unavailable", substituted, write_policy) == []
    [found] = run_rule("ep-substituted", substituted, write_policy)
    assert found.severity is Severity.INFO and "every figure in this report is a CPU figure" in found.message


def test_option_not_applied_points_at_the_option(write_policy):
    where = Location("policy.yaml", 4, "execution_provider.options.enable_cuda_graph")
    session = cuda_session()
    session.options = [OptionCheck("enable_cuda_graph", "1", "0", False, where),
                       OptionCheck("device_id", "0", "0", True, None)]
    [found] = run_rule("option-not-applied", session, write_policy)
    assert found.location == where and "enable_cuda_graph='1' is not in effect: the session reports '0'" in found.message


def test_free_dim_still_symbolic(write_policy):
    where = Location("policy.yaml", 6, "session.free_dimension_overrides.batch_size")
    session = SessionEvidence(ProviderCheck(CPU, None, True, ran_on=(CPU,)))
    session.dims = [DimCheck("batch_size", 1, "unresolved", ("input_ids[0]",), where),
                    DimCheck("sequence_length", 1, "pinned", ("input_ids[1]",), None),
                    DimCheck("batch", 1, "no-such-dim", (), None)]  # the static rule reports this one
    [found] = run_rule("free-dim-unresolved", session, write_policy)
    assert found.location == where and "input_ids[0]" in found.message


def test_changed_outputs_fail_the_gate(write_policy):
    session = SessionEvidence(ProviderCheck(CPU, None, True, ran_on=(CPU,)))
    correctness = Correctness("ORT_DISABLE_ALL on CPUExecutionProvider", [
        OutputComparison("logits", "float32", (1, 1, 320), 1e-3, 1e-4, 0.41, 57, 320),
        OutputComparison("present.3.key", "float32", (1, 2, 9, 16), 1e-3, 1e-4, 0.0, 0, 288)])
    [found] = run_rule("optimization-changed-outputs", session, write_policy, correctness=correctness)
    assert found.severity is Severity.ERROR and "'logits'" in found.message and "57 of 320" in found.message


def test_throughput_target_missed_on_the_matching_gpu(write_policy):
    policy = CUDA_POLICY + "throughput:\n  device: h100-sxm\n  max_p50_latency_ms: 8\n  min_tokens_per_s: 50\n"
    [found] = run_rule("throughput-target-missed", cuda_session(), write_policy, policy, measurement=measurement(10))
    assert found.location.key_path == "throughput.max_p50_latency_ms" and "p50 latency (ms) is 10" in found.message


def test_a_glob_matches_gpus_the_catalog_names_differently(write_policy):
    policy = CUDA_POLICY + "throughput:\n  match: 'NVIDIA H100*'\n  max_ms_per_token: 8\n"
    [found] = run_rule("throughput-target-missed", cuda_session(), write_policy, policy, measurement=measurement(10))
    assert found.location.key_path == "throughput.max_ms_per_token" and "is 10" in found.message


def test_throughput_target_on_another_gpu_is_not_applicable(write_policy):
    policy = CUDA_POLICY + "throughput:\n  device: h100-sxm\n  max_p50_latency_ms: 8\n"
    [found] = run_rule("throughput-target-missed", cuda_session(), write_policy, policy,
                       measurement=measurement(10, device="NVIDIA A10G"))
    assert found.severity is Severity.INFO and "not applicable on this machine" in found.message


def test_dump_unavailable_when_the_provider_compiled_nodes(write_policy):
    session = cuda_session()
    session.dump = DumpEvidence(None, False, "ORT cannot save the optimized model: Unable to serialize model as it "
                                             "contains compiled nodes")
    [found] = run_rule("optimized-dump-unavailable", session, write_policy)
    assert found.severity is Severity.WARNING and "compiled nodes" in found.message


def test_compute_nodes_on_cpu_in_a_cuda_session(write_policy):
    session = cuda_session()
    session.placement = {CUDA: {"MoE": 4, "MemcpyToHost": 2, "MemcpyFromHost": 2},
                         CPU: {"GroupQueryAttention": 1, "Shape": 6, "Gather": 3}}
    [found] = run_rule("compute-off-requested-provider", session, write_policy)
    assert "GroupQueryAttention x1" in found.message and "4 Memcpy nodes" in found.message
    assert "Shape" not in found.message  # shape computations stay on CPU on purpose


def test_placement_all_on_cuda_is_fine(write_policy):
    session = cuda_session()
    session.placement = {CUDA: {"MoE": 4, "GroupQueryAttention": 1}, CPU: {"Shape": 6}}
    assert run_rule("compute-off-requested-provider", session, write_policy) == []


def test_cpu_only_placement_from_a_real_cpu_run_is_not_judged_as_gpu(write_policy):
    from ortgate.config.deployment import setup_from_policy
    from ortgate.config.policy import load_policy
    from ortgate.runner import session as rs

    setup = setup_from_policy(load_policy(write_policy("name: p\n", name="cpu.yaml")))
    placement = rs.placement(rs.create_session(str(MODEL), setup, record_placement=True).session)
    session = SessionEvidence(ProviderCheck(CPU, None, True, ran_on=(CPU,)), placement=placement)
    assert run_rule("compute-off-requested-provider", session, write_policy) == []
    # The same real placement, had the session been created for CUDA, puts every MoE on CPU.
    session = cuda_session(ran_on=(CUDA, CPU))
    session.placement = placement
    [found] = run_rule("compute-off-requested-provider", session, write_policy)
    assert "MoE x4" in found.message
