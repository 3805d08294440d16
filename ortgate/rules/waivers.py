"""Waiver rules (OGW): the policy's waivers themselves. The gate raises these when it applies waivers."""

from __future__ import annotations

from ortgate.findings import Severity
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext


@rule("OGW001", "waiver-expired", Severity.ERROR)
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


@rule("OGW002", "waiver-unused", Severity.WARNING)
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
