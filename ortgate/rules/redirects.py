"""Rule references that outlive a split or a rename, as ruff's redirect table does for its codes.

A policy, a waiver, `--select` or `--ignore` written against an older ortgate must keep meaning what it meant:

- RENAMED: a code or name that no longer names a rule -> the code of the rule that carries its findings now.
- SPLIT_FROM: a code split off an older rule -> the rule(s) whose findings it used to be. A reference to the older
  rule also covers the codes split from it, so a policy written before the split selects, ignores, re-levels and
  waives the same findings as before. A reference to the new code covers that code alone.

Every entry is also recorded in CHANGELOG.md.
"""

from __future__ import annotations

RENAMED: dict[str, str] = {}

SPLIT_FROM: dict[str, tuple[str, ...]] = {
    "OGM005": ("OGM002",),  # gqa-heads-not-grouped
    "OGM006": ("OGM002",),  # gqa-window-mismatch
    "OGM008": ("OGF001",),  # moe-layer-count-mismatch
    "OGM009": ("OGF002",),  # attention-layer-count-mismatch
    "OGM007": ("OGM004",),  # tp-kv-heads-replicated
    "OGM011": ("OGM010",),  # forbidden-op
    "OGP007": ("OGP002",),  # provider-option-c-api-only
    "OGP008": ("OGP002",),  # provider-option-unverified
    "OGP009": ("OGP005",),  # trt-timing-cache-disabled
    "OGK004": ("OGK001", "OGK002"),  # index-op-not-on-ep (OGK002 reported integer-only CPU nodes under capture)
    "OGK005": ("OGK003",),  # index-memcpy-in-graph
    "OGS008": ("OGS002",),  # capture-dim-not-pinned
    "OGS009": ("OGS002",),  # static-kv-dim-not-pinned
    "OGS010": ("OGS004",),  # kv-dim-pinned
    "OGC002": ("OGC001",),  # session-option-drift
    "OGF010": ("OGF004",),  # rmsnorm-fused-by-ort
    "OGF011": ("OGF007",),  # qkv-packed-by-ort
    "OGR009": ("OGR001",),  # ep-substituted
}
# OGM002 gqa-config-mismatch took over GroupQueryAttention num_heads / kv_num_heads against the model config from
# OGF002 gqa-not-fused: a reference to gqa-not-fused covers OGM002 as well.
SPLIT_FROM["OGM002"] = ("OGF002",)
