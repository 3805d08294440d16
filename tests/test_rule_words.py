"""A rule's words are built by the rule apart from the walk that finds the fact (as ruff's message() and
fix_title()), so they are tested on their own: here moe-routing-mismatch's."""

from __future__ import annotations

import struct

from ortgate.rules.model import _ABSENT, MOE_ROUTING_FIX, RoutingMismatch, RoutingWant


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_a_float32_attribute_is_shown_by_the_digits_that_read_back_as_it():
    want = RoutingWant(1.0, "the qwen3_5_moe family uses 1 (model_families.json)")
    m = RoutingMismatch("com.microsoft.MoE activation_alpha", "activation_alpha", _float32(1.702), want,
                        " in layers 0-1", 2)
    assert m.message() == ("com.microsoft.MoE activation_alpha=1.702 in layers 0-1 (2 nodes), but the qwen3_5_moe "
                           "family uses 1 (model_families.json): expected 1.0")
    assert m.fix_title() == MOE_ROUTING_FIX


def test_an_expected_absence_is_said_not_printed_as_none():
    want = RoutingWant(None, "the qwen3_5_moe family does not clamp")
    m = RoutingMismatch("com.microsoft.MoE swiglu_limit", "swiglu_limit", 7.0, want, " in layer 3", 1)
    assert m.message() == ("com.microsoft.MoE swiglu_limit=7.0 in layer 3 (1 node), but the qwen3_5_moe family "
                           "does not clamp: expected no swiglu_limit")


def test_an_absent_attribute_is_said_absent():
    want = RoutingWant(7.0, "the gpt_oss family clamps at 7.0")
    m = RoutingMismatch("com.microsoft.MoE swiglu_limit", "swiglu_limit", _ABSENT, want, "", 4)
    assert m.message().startswith("com.microsoft.MoE swiglu_limit=absent (4 nodes), but the gpt_oss family clamps")


def test_an_integer_attribute_is_shown_as_it_is():
    m = RoutingMismatch("TopK k", "TopK k", 2, RoutingWant(8, "the policy (p.yaml:3)"), " in layers 0-47", 48)
    assert m.message() == "TopK k=2 in layers 0-47 (48 nodes), but the policy (p.yaml:3): expected 8"
