"""Waiver rules (OGW): the policy's waivers and the findings baseline themselves. The gate raises these when it
applies them."""

from __future__ import annotations

from ortgate.findings import Severity
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext


@rule("OGW001", "waiver-expired", Severity.ERROR, policy_only=True)
def waiver_expired(ctx: RuleContext):
    """A waiver in the policy is past its `expires` date.

    ## What it checks
    Each entry of the policy's `waivers:` with an `expires` date before today. An expired waiver no longer
    suppresses anything: the findings it covered are reported again, and this finding points at the waiver.

    ## Why it costs throughput
    A waiver is a debt with a due date: the slow graph or config it excused is still there. Letting waivers
    lapse silently would turn a temporary exception into a permanent one.

    ## Bad
    ```yaml
    waivers:
      - {rule: moe-not-fused, reason: "re-export pending", expires: 2025-01-31}
    ```

    ## Good
    ```yaml
    waivers:
      - {rule: moe-not-fused, reason: "re-export tracked in #412", expires: 2099-12-31}
    ```

    ## Fix
    Fix what the waiver excused and delete it, or renew it with a new date and an honest reason.
    """
    return ()  # raised by the gate, which owns waivers


@rule("OGW002", "waiver-unused", Severity.WARNING, policy_only=True)
def waiver_unused(ctx: RuleContext):
    """A waiver in the policy matched no finding.

    ## What it checks
    Each unexpired entry of the policy's `waivers:`: if no finding of its rule (and node glob) was reported,
    the waiver is stale or its pattern is wrong.

    ## Why it costs throughput
    A waiver that matches nothing today will silently match a new regression tomorrow.

    ## Bad
    ```yaml
    waivers:
      - {rule: gqa-not-fused, node: "/model/layers.*/attn/*", reason: "fixed in v2"}
    ```

    ## Good
    ```yaml
    waivers: []
    ```

    ## Fix
    Delete the waiver, or correct its `rule` / `node` pattern.
    """
    return ()  # raised by the gate, which owns waivers


@rule("OGW003", "baseline-entry-stale", Severity.INFO)
def baseline_entry_stale(ctx: RuleContext):
    """A baseline entry matched no finding: what it accepted is gone.

    ## What it checks
    Each entry of the `--baseline FILE` whose file was linted and whose rule ran, but which matched no finding.
    Entries name a finding by rule, file, decoder layer and the structure of the match (never a node name), so
    a re-export that only renames nodes keeps matching. A version-1 baseline (written before fingerprints left
    node names out) matches by node name: after such a re-export its entries are reported here. A version-2
    baseline names a model by its file name alone, so one entry accepts the finding in every model of that name:
    lint says so once (version 3 names the model's path relative to the working directory). A version-3 baseline
    names no model in its entries, so an entry about a file several models share (the policy's
    `model.moe_layers`) accepts its finding in every model linted with it: lint says so once (version 4 names the
    model each entry was written for). An entry written for a model this run did not lint is not judged.

    ## Why it costs throughput
    A stale entry accepts nothing today and may silently accept a new regression tomorrow, when a finding with
    the same identity comes back.

    ## Bad
    ```json baseline
    {"format": "ortgate-baseline", "version": 3, "findings": [
      {"fingerprint": "moe-not-fused|model.onnx|3|model:MatMul#0", "rule": "moe-not-fused",
       "file": "model.onnx", "layer": 3}]}
    ```

    ## Good
    ```json baseline
    {"format": "ortgate-baseline", "version": 3, "findings": []}
    ```

    ## Fix
    `ortgate lint MODEL --baseline FILE --prune-baseline` rewrites FILE without its stale entries (and as
    version 4), keeping the entries this run could not judge.
    """
    return ()  # raised by the gate, which owns the baseline
