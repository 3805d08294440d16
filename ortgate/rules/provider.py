"""Execution-provider rules (OGP): provider options that decide whether the GPU is used well, or at all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ortgate.config.deployment import SessionSetup
from ortgate.cost.repairs import RepairKind
from ortgate.findings import Severity
from ortgate.graph.index import MS_DOMAIN, Graph
from ortgate.knowledge import (
    catalog_option,
    cuda_providers,
    graph_capture_option,
    normalize_option_value,
    provider_catalog,
    tf32_ops,
)
from ortgate.knowledge.provider_names import CANN, CPU, CUDA, TENSORRT
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext, judged_setups


def cuda_graph_option(setup: SessionSetup) -> str | None:
    """The option that turns CUDA graph capture on for this setup's provider, if it has one."""
    if setup.provider_name not in cuda_providers():
        return None
    return graph_capture_option(setup.provider_name)


def is_true(value: str | None) -> bool:
    """ORT's provider-option bool parsing: 1/true/True are true."""
    return value is not None and normalize_option_value(value) == "1"


def _flag(option_of: Callable[[SessionSetup], str | None]) -> Callable[[SessionSetup], bool | None]:
    """A setup's boolean provider option `option_of(setup)` as ORT parses it, None when unset (for judged_setups)."""

    def value(setup: SessionSetup) -> bool | None:
        key = option_of(setup)
        text = setup.option(key) if key else None
        return None if text is None else is_true(text)

    return value


def cuda_graph_enabled(setup: SessionSetup) -> bool:
    key = cuda_graph_option(setup)
    return key is not None and is_true(setup.option(key))


@rule("OGP001", "cuda-graph-disabled", Severity.ERROR, needs=("provider",), price=RepairKind.cuda_graph)
def cuda_graph_disabled(ctx: RuleContext):
    """CUDA graph capture is off for a CUDA or TensorRT deployment.

    ## What it checks
    CUDAExecutionProvider's `enable_cuda_graph` and TensorrtExecutionProvider's `trt_cuda_graph_enable`
    (NvTensorRTRTX: `enable_cuda_graph`), in the policy's `execution_provider.options` and in
    genai_config.json's provider options. Unset means off (the default).

    ## Why it costs throughput
    A decode step of a 40-layer MoE model is thousands of small kernel launches; at batch 1 the GPU waits on
    the CPU to launch them. With CUDA graph, ORT captures the step once and replays it with one launch:
    launch overhead disappears, which at decode time is often the largest single win.

    ## Bad
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "0"}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "1"}
    session:
      free_dimension_overrides: {batch_size: 1, sequence_length: 1}
    ```

    ## Fix
    Set `enable_cuda_graph: "1"` (TensorRT: `trt_cuda_graph_enable: "1"`); in genai_config.json
    `"provider_options": [{"cuda": {"enable_cuda_graph": "1"}}]` (the genai builder writes "0" unless built
    with `--extra_options enable_cuda_graph=true`). Capture also needs every node on the GPU, no control
    flow, fixed shapes and IOBinding to fixed buffers: see cuda-graph-blocker.
    """
    for setup in judged_setups(ctx, _flag(cuda_graph_option)):
        key = cuda_graph_option(setup)
        if key is None:
            continue
        setting = setup.provider_options.get(key)
        if setting is not None and is_true(str(setting.value)):
            continue
        state = f"{key} is {str(setting.value)!r}" if setting is not None else f"{key} {unset_words(setup.provider_name, key)}"
        yield ctx.finding(
            f"{setup.label}: CUDA graph is off for {setup.provider_name}: {state}",
            location=setting.location if setting is not None else setup.missing(_options_path(setup, key)),
            fix=f"Set {key}: \"1\" in the {setup.provider_name} options.",
            properties={"provider": setup.provider_name, "option": key},
        )


def _options_path(setup: SessionSetup, key: str) -> str:
    if setup.origin == "policy":
        return f"execution_provider.options.{key}"
    return f"model.decoder.session_options.provider_options.{key}"


@rule("OGP002", "unknown-provider-option", Severity.ERROR, needs=("session",), policy_only=True)
def unknown_provider_option(ctx: RuleContext):
    """A provider option key the execution provider does not have.

    ## What it checks
    Every key under the policy's `execution_provider.options` and genai_config.json's provider options,
    against the provider's option catalog (CUDA, TensorRT, CANN, CPU; the catalog names the ORT version it
    reflects), with the nearest valid key as a suggestion. Keys that exist in the C/C++ API only are
    provider-option-c-api-only's, keys some ORT builds accept provider-option-unverified's; a provider without a
    catalog is reported as undecided.

    ## Why it costs throughput
    ORT's CUDA, TensorRT and CANN providers reject unknown keys. Python's `InferenceSession` catches that
    error, prints "EP Error ... Falling back to ['CPUExecutionProvider']" and builds a CPU session: the
    model runs, on the CPU, and nothing fails. (onnxruntime-genai fails to create the session instead.)

    ## Bad
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "1", cuda_graph_enable_partial: "1", max_batch_size: "128"}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "1"}
    session:
      free_dimension_overrides: {batch_size: 1}
    ```

    ## Fix
    Delete or correct the key (the catalog in ortgate/knowledge/provider_options.json lists every key). There is
    no "partial" CUDA graph option and no `max_batch_size` CUDA option: pin the batch with a free-dimension
    override.
    """
    for setup in ctx.deployment.setups:
        if setup.provider_name and setup.provider_options and provider_catalog(setup.provider_name) is None:
            yield ctx.undecided(f"no option catalog for {setup.provider_name}; its options were not checked")
    for setup, catalog, key, setting in option_keys(ctx):
        if catalog.option(key) is not None or catalog.is_possibly_valid(key):
            continue
        hint = catalog.suggest(key)
        yield ctx.finding(
            f"{setup.label}: {setup.provider_name} has no option {key!r}"
            f"{f' (did you mean {hint!r}?)' if hint else ''}: {_rejection(setup)}",
            location=setting.location,
            fix=(f"Rename it to {hint!r}." if hint else "Remove it.") + f" Valid options are listed by the "
                f"{setup.provider_name} catalog (ORT {catalog.ort_version}).",
            properties={"provider": setup.provider_name, "option": key, "suggestion": hint},
        )


def option_keys(ctx: RuleContext):
    """(setup, its provider's option catalog, key, setting) for every provider option the deployment sets, where
    the provider has a catalog."""
    for setup in ctx.deployment.setups:
        catalog = provider_catalog(setup.provider_name) if setup.provider_name else None
        if catalog is None:
            continue
        for key, setting in sorted(setup.provider_options.items()):
            yield setup, catalog, key, setting


def _rejection(setup: SessionSetup) -> str:
    """What a provider error does to this declaration's session."""
    if setup.origin == "policy":
        return f"ORT's Python API rejects it and silently falls back to {CPU}"
    return "session creation fails in onnxruntime-genai"


@rule("OGP007", "provider-option-c-api-only", Severity.ERROR, needs=("session",), policy_only=True)
def provider_option_c_api_only(ctx: RuleContext):
    """A provider option in the policy exists only in ORT's C/C++ API: Python's InferenceSession rejects it.

    ## What it checks
    Every key under the policy's `execution_provider.options` (the policy is what a Python InferenceSession is
    built from) that the provider's option catalog marks as C/C++-only: TensorRT's `has_user_compute_stream`,
    `trt_load_user_initializer` and the external-data byte-stream options, which take pointers or in-memory data
    the Python bindings do not pass.

    ## Why it costs throughput
    Python's InferenceSession passes the key to the provider factory, which rejects it; the session then falls
    back to CPUExecutionProvider with only a printed "EP Error". The deployment runs on the CPU and no check fails.

    ## Bad
    ```yaml
    execution_provider:
      name: TensorrtExecutionProvider
      options: {trt_fp16_enable: "True", trt_load_user_initializer: "True"}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: TensorrtExecutionProvider
      options: {trt_fp16_enable: "True"}
    ```

    ## Fix
    Remove it from the policy; set it from C/C++ if the deployment needs it.
    """
    for setup, catalog, key, setting in option_keys(ctx):
        option = catalog.option(key)
        if option is None or option.python_api or setup.origin != "policy":
            continue
        yield ctx.finding(
            f"{setup.label}: {setup.provider_name} option {key!r} exists only in the C/C++ API: {_rejection(setup)}",
            location=setting.location,
            fix="Remove it from the policy (set it from C/C++ if the deployment needs it).",
            properties={"provider": setup.provider_name, "option": key},
        )


@rule("OGP008", "provider-option-unverified", Severity.WARNING, needs=("session",), policy_only=True)
def provider_option_unverified(ctx: RuleContext):
    """A provider option key that some ORT builds accept and the catalog's ORT version does not verify.

    ## What it checks
    Every key under the policy's `execution_provider.options` and genai_config.json's provider options that the
    provider's option catalog lists as possibly valid: seen in some ORT source versions, not in the version the
    catalog reflects.

    ## Why it costs throughput
    If the ORT build you deploy does not accept the key, the provider rejects it: Python's InferenceSession falls
    back to CPUExecutionProvider and onnxruntime-genai fails to create the session. If it does, all is well: the
    finding asks you to check which.

    ## Bad
    ```yaml
    execution_provider:
      name: CANNExecutionProvider
      options: {precision_mode_v2: must_keep_origin_dtype}   # not in the catalog's ORT version
    ```

    ## Good
    ```yaml
    execution_provider:
      name: CANNExecutionProvider
      options: {precision_mode: must_keep_origin_dtype}
    ```

    ## Fix
    Check that the provider build you deploy accepts the key, and waive the finding with that version in the
    reason; remove the key if it does not.
    """
    for setup, catalog, key, setting in option_keys(ctx):
        if catalog.option(key) is not None or not catalog.is_possibly_valid(key):
            continue
        yield ctx.finding(
            f"{setup.label}: {key!r} is not a verified {setup.provider_name} option: "
            f"{catalog.possibly_valid_note or 'seen in some ORT source versions only'}",
            location=setting.location,
            fix=f"Check that the {setup.provider_name} build you deploy accepts {key!r}; if it does not, "
                "session creation fails or falls back to CPU.",
            properties={"provider": setup.provider_name, "option": key, "verified": False},
        )


@rule("OGP003", "provider-option-invalid-value", Severity.ERROR, needs=("session",), policy_only=True)
def provider_option_invalid_value(ctx: RuleContext):
    """A provider option has a value the execution provider cannot parse.

    ## What it checks
    Every known key under the policy's `execution_provider.options` and genai_config.json's provider options,
    against its type and allowed values in the provider's option catalog: booleans (`0`/`1`/`true`/`false`/
    `True`/`False`), integers and sizes with their ranges, enums such as `arena_extend_strategy`. Values are
    checked as ORT receives them: Python's InferenceSession passes `str(value)`, so YAML `true` arrives as
    `"True"` (a valid boolean) and `1.0` as `"1.0"` (not an integer).

    TensorRT through the Python API: Python parses TensorRT's options itself and takes only
    `True`/`False`/`true`/`false` for booleans; `"1"` and `"0"`, which the C/C++ API accepts, are rejected.

    ## Why it costs throughput
    ORT rejects the value while creating the provider. Python's InferenceSession catches that error, prints
    "EP Error ... Falling back to ['CPUExecutionProvider']" and runs the whole model on CPU; onnxruntime-genai
    fails to start. `enable_cuda_graph: "yes"` does not turn capture on: it turns the GPU off.

    ## Bad
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "yes", arena_extend_strategy: SameAsRequested}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: CUDAExecutionProvider
      options: {enable_cuda_graph: "1", arena_extend_strategy: kSameAsRequested}
    ```

    ## Fix
    Use a value of the option's type (the finding names it). Quote provider option values in YAML
    (`"1"`); for TensorRT from Python write `"True"` / `"False"`.
    """
    for setup, catalog, key, setting in option_keys(ctx):
        option = catalog.option(key)
        if option is None:
            continue  # unknown-provider-option
        problem = option.validate(setting.value)
        if problem is None:
            continue
        consequence = (f"ORT rejects it and Python's InferenceSession silently falls back to {CPU}"
                       if setup.origin == "policy" else "onnxruntime-genai fails to create the session")
        yield ctx.finding(
            f"{setup.label}: {setup.provider_name} option {key!r} {problem}: {consequence}",
            location=setting.location,
            fix=f"Set {key} to a valid value (default {option.default_string!r}: {option.description})",
            properties={"provider": setup.provider_name, "option": key, "value": str(setting.value),
                        "type": option.type, "catalog_ort_version": catalog.ort_version},
        )


def float32_gemms(graph: Graph) -> list:
    """The nodes whose float32 math TF32 speeds up (MatMul / Gemm / FusedMatMul / Conv) with a float32 first input."""
    return [n for domain, op in tf32_ops() for n in graph.by_op(domain, op) if graph.dtype(n.input(0)) == "float"]


def unset_words(provider: str | None, key: str) -> str:
    """"is not set (default off)" with the default from the provider's option catalog, when it has one."""
    catalog = provider_catalog(provider) if provider else None
    option = catalog.option(key) if catalog else None
    return f"is not set ({option.default_words})" if option else "is not set"


@rule("OGP004", "tf32-disabled", Severity.WARNING, needs=("provider",))
def tf32_disabled(ctx: RuleContext):
    """TF32 is turned off for a float32 model on the CUDA provider.

    ## What it checks
    CUDAExecutionProvider's `use_tf32` (default on) in the policy and genai_config.json, when the model has
    float32 MatMul / Gemm / FusedMatMul / Conv nodes.

    ## Why it costs throughput
    With TF32 allowed, cuBLAS and cuDNN run float32 GEMMs on tensor cores (Ampere and newer) at several times
    the FP32 rate, with a 10-bit mantissa for the products. `use_tf32: "0"` forces full FP32 GEMMs: a float32
    model loses most of the GPU's matmul throughput.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {use_tf32: "0"}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    projection (float[T, 64] h) => (float[T, 256] y)
    <float[64, 256] w>
    {
      y = MatMul(h, w)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}   # use_tf32 defaults to on
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    projection (float[T, 64] h) => (float[T, 256] y)
    <float[64, 256] w>
    {
      y = MatMul(h, w)
    }
    ```

    ## Fix
    Delete `use_tf32` or set it to `"1"`. If the model needs exact FP32 products, say so with a waiver; better
    still, export the model in float16/bfloat16 (`-p fp16` for the onnxruntime-genai builder), which also
    gives the GroupQueryAttention and QMoE kernels CUDA accepts.
    """
    gemms: list | None = None
    for setup in judged_setups(ctx, _flag(lambda _s: "use_tf32")):
        if setup.provider_name != CUDA:
            continue
        setting = setup.provider_options.get("use_tf32")
        option = catalog_option(CUDA, "use_tf32")
        if setting is None or option.validate(setting.value) is not None or is_true(str(setting.value)):
            continue
        if gemms is None:
            gemms = float32_gemms(ctx.executed)
        if not gemms:
            continue
        kinds = Counter(n.key for n in gemms)
        yield ctx.finding(
            f"{setup.label}: use_tf32 is {str(setting.value)!r} but the model runs {len(gemms)} float32 GEMMs "
            f"({', '.join(f'{k} x{v}' for k, v in sorted(kinds.items()))}) on CUDA: they run at full FP32 rate, "
            "without tensor cores",
            location=setting.location,
            fix=f"Remove use_tf32 ({option.default_words}) or set it to \"1\"; or export the model in float16/bfloat16.",
            related=gemms,
            properties={"provider": setup.provider_name, "float32_gemms": len(gemms)},
        )


def _config_on(setup: SessionSetup, key: str) -> bool:
    return (setup.config_entry(key) or "").strip() == "1"


@rule("OGP005", "compile-cache-disabled", Severity.WARNING, needs=("provider",))
def compile_cache_disabled(ctx: RuleContext):
    """A compiling provider rebuilds its engines at every session start: no engine cache, no EP context model.

    ## What it checks
    For TensorrtExecutionProvider: `trt_engine_cache_enable`, or an EP context model (`trt_dump_ep_context_model`
    or the session config entry `ep.context_enable: "1"`, or a model that already holds com.microsoft EPContext
    nodes). This is the "compiled-graph cache" of a static-graph recipe (such as the CANN one) in ORT's terms.
    The timing cache is trt-timing-cache-disabled's.

    ## Why it costs throughput
    TensorRT compiles each subgraph into an engine when the session is created: minutes for a large MoE model,
    again on every restart, scale-out and profile change. Without a cache, replicas serve nothing while they
    build.

    ## Bad
    ```yaml
    execution_provider:
      name: TensorrtExecutionProvider
      options: {trt_fp16_enable: "True"}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: TensorrtExecutionProvider
      options:
        trt_fp16_enable: "True"
        trt_engine_cache_enable: "True"
        trt_engine_cache_path: /cache/trt
    ```

    ## Fix
    Set `trt_engine_cache_enable: "True"` with a persistent `trt_engine_cache_path`, or ship an EP context model:
    create the session once with `trt_dump_ep_context_model: "True"` and deploy the `*_ctx.onnx` it writes.
    """
    for setup in _tensorrt_setups(ctx, _flag(lambda _s: "trt_engine_cache_enable")):
        engine_cache = (is_true(setup.option("trt_engine_cache_enable"))
                        or is_true(setup.option("trt_dump_ep_context_model"))
                        or _config_on(setup, "ep.context_enable"))
        if not engine_cache:
            setting = setup.provider_options.get("trt_engine_cache_enable")
            state = (f"is {str(setting.value)!r}" if setting is not None
                     else unset_words(setup.provider_name, "trt_engine_cache_enable"))
            yield ctx.finding(
                f"{setup.label}: TensorRT engine cache {state} and no EP context model is written or given: "
                "every session start rebuilds the TensorRT engines",
                location=setting.location if setting is not None else setup.missing(
                    _options_path(setup, "trt_engine_cache_enable")),
                fix='Set trt_engine_cache_enable: "True" and trt_engine_cache_path, or deploy an EP context model '
                    '(trt_dump_ep_context_model: "True").',
                properties={"provider": setup.provider_name, "option": "trt_engine_cache_enable"},
            )


def _tensorrt_setups(ctx: RuleContext, value_of: Callable[[SessionSetup], Any]) -> list[SessionSetup]:
    """TensorRT setups that build engines (none when the model already is an EP context model), judged once."""
    if ctx.model.by_op(MS_DOMAIN, "EPContext"):
        return []
    return [s for s in judged_setups(ctx, value_of) if s.provider_name == TENSORRT]


@rule("OGP009", "trt-timing-cache-disabled", Severity.INFO, needs=("provider",))
def trt_timing_cache_disabled(ctx: RuleContext):
    """TensorRT's timing cache is off: every engine build re-times every tactic.

    ## What it checks
    For TensorrtExecutionProvider (unless the model is an EP context model, whose engines are built already):
    `trt_timing_cache_enable` in the policy and genai_config.json. Unset means off.

    ## Why it costs throughput
    The timing cache keeps the measured speed of each kernel tactic, so a rebuild (a new shape profile, a new model
    version, a new replica without an engine cache) skips the slowest part of the build. It saves start-up time,
    not decode time: information.

    ## Bad
    ```yaml
    execution_provider:
      name: TensorrtExecutionProvider
      options: {trt_engine_cache_enable: "True"}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: TensorrtExecutionProvider
      options: {trt_engine_cache_enable: "True", trt_timing_cache_enable: "True"}
    ```

    ## Fix
    Set `trt_timing_cache_enable: "True"` (and `trt_timing_cache_path` on persistent storage).
    """
    for setup in _tensorrt_setups(ctx, _flag(lambda _s: "trt_timing_cache_enable")):
        if is_true(setup.option("trt_timing_cache_enable")):
            continue
        setting = setup.provider_options.get("trt_timing_cache_enable")
        yield ctx.finding(
            f"{setup.label}: TensorRT timing cache is off: engine builds re-time every tactic",
            location=setting.location if setting is not None else setup.missing(
                _options_path(setup, "trt_timing_cache_enable")),
            fix='Set trt_timing_cache_enable: "True" (and trt_timing_cache_path).',
            properties={"provider": setup.provider_name, "option": "trt_timing_cache_enable"},
        )


@rule("OGP006", "cann-graph-disabled", Severity.ERROR, needs=("provider",))
def cann_graph_disabled(ctx: RuleContext):
    """CANN's graph mode is turned off: the Ascend NPU runs the model operator by operator.

    ## What it checks
    CANNExecutionProvider's `enable_cann_graph` (default on) in the policy and genai_config.json.

    ## Why it costs throughput
    With graph mode, CANN compiles the supported subgraphs into one offline model and runs each as a whole: the
    static-graph mode a low-latency MoE decode recipe depends on. With `enable_cann_graph: "0"` every node is a
    separate single-operator launch, with host round trips between them.

    ## Bad
    ```yaml
    execution_provider:
      name: CANNExecutionProvider
      options: {enable_cann_graph: "0"}
    ```

    ## Good
    ```yaml
    execution_provider:
      name: CANNExecutionProvider
      options: {enable_cann_graph: "1", precision_mode: must_keep_origin_dtype}
    ```

    ## Fix
    Delete `enable_cann_graph` (on by default) or set it to `"1"`; pin the model's dynamic dims
    (session.free_dimension_overrides) so that the graph compiles once.
    """
    for setup in judged_setups(ctx, _flag(lambda _s: "enable_cann_graph")):
        if setup.provider_name != CANN:
            continue
        setting = setup.provider_options.get("enable_cann_graph")
        option = catalog_option(CANN, "enable_cann_graph")
        if setting is None or option.validate(setting.value) is not None or is_true(str(setting.value)):
            continue
        yield ctx.finding(
            f"{setup.label}: enable_cann_graph is {str(setting.value)!r}: CANN runs every node as a single operator",
            location=setting.location,
            fix=f'Remove enable_cann_graph ({option.default_words}) or set it to "1".',
            properties={"provider": setup.provider_name, "option": "enable_cann_graph"},
        )
