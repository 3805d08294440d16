"""Execution-provider rules (OGP): provider options that decide whether the GPU is used well, or at all."""

from __future__ import annotations

from ortgate.knowledge import graph_capture_option, provider_catalog
from ortgate.lint.context import RuleContext
from ortgate.lint.deployment import SessionSetup
from ortgate.lint.findings import Severity
from ortgate.rules.base import rule


def cuda_graph_option(setup: SessionSetup) -> str | None:
    """The option that turns CUDA graph capture on for this setup's provider, if it has one."""
    if setup.provider_name not in CUDA_GRAPH_PROVIDERS:
        return None
    return graph_capture_option(setup.provider_name)


# Providers whose graph capture is CUDA graph (DirectML and WebGPU capture graphs of their own).
CUDA_GRAPH_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider")


def is_true(value: str | None) -> bool:
    """ORT's provider-option bool parsing: 1/true/True are true."""
    return (value or "").strip().lower() in ("1", "true")


def cuda_graph_enabled(setup: SessionSetup) -> bool:
    key = cuda_graph_option(setup)
    return key is not None and is_true(setup.option(key))


@rule("OGP001", "cuda-graph-disabled", Severity.ERROR)
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
    for setup in ctx.deployment.setups:
        key = cuda_graph_option(setup)
        if key is None:
            continue
        setting = setup.provider_options.get(key)
        if setting is not None and is_true(str(setting.value)):
            continue
        state = f"{key} is {str(setting.value)!r}" if setting is not None else f"{key} is not set (default off)"
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


@rule("OGP002", "unknown-provider-option", Severity.ERROR)
def unknown_provider_option(ctx: RuleContext):
    """A provider option key the execution provider does not accept.

    ## What it checks
    Every key under the policy's `execution_provider.options` and genai_config.json's provider options,
    against the provider's option catalog (CUDA, TensorRT, CANN, CPU; the catalog names the ORT version it
    reflects), with the nearest valid key as a suggestion.

    ## Why it costs throughput
    ORT's CUDA, TensorRT and CANN providers reject unknown keys. Python's `InferenceSession` catches that
    error, prints "EP Error ... Falling back to ['CPUExecutionProvider']" and builds a CPU session: the
    model runs, 10-100x slower, and nothing fails. (onnxruntime-genai fails to create the session instead.)

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
    Delete or correct the key (`ortgate explain unknown-provider-option` lists none; the catalog in
    ortgate/knowledge/provider_options.json lists every key). There is no "partial" CUDA graph option and no
    `max_batch_size` CUDA option: pin the batch with a free-dimension override.
    """
    for setup in ctx.deployment.setups:
        if not setup.provider_name or not setup.provider_options:
            continue
        catalog = provider_catalog(setup.provider_name)
        if catalog is None:
            yield ctx.undecided(f"no option catalog for {setup.provider_name}; its options were not checked")
            continue
        for key, setting in sorted(setup.provider_options.items()):
            if catalog.option(key) is not None:
                continue
            hint = catalog.suggest(key)
            consequence = ("ORT's Python API rejects it and silently falls back to CPUExecutionProvider"
                           if setup.origin == "policy" else "session creation fails in onnxruntime-genai")
            yield ctx.finding(
                f"{setup.label}: {setup.provider_name} has no option {key!r}"
                f"{f' (did you mean {hint!r}?)' if hint else ''}: {consequence}",
                location=setting.location,
                fix=(f"Rename it to {hint!r}." if hint else "Remove it.") + f" Valid options are listed by the "
                    f"{setup.provider_name} catalog (ORT {catalog.ort_version}).",
                properties={"provider": setup.provider_name, "option": key, "suggestion": hint},
            )
