"""ortgate's own norm fusions, written with onnxscript's rewriter API (pattern / check / rewrite), for the RMSNorm
spellings onnxscript's `ort_fusions` rule (Pow -> ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul only) does not read,
and for a LayerNorm without bias written out by hand.

Each rule reads one family of forms (the lint's `rmsnorm_forms` keys, ortgate.graph.patterns.norms):

    RMSNorm -> SimplifiedLayerNormalization (axis=-1, epsilon, stash_type = the compute type)
        x2 = Pow(x, 2) | Mul(x, x)                                  (pow_* | square_mul)
        ms = ReduceMean(x2, axes=[-1], keepdims=1)
        v  = Add(ms, eps)
        y  = Div(x, Sqrt(v))                                        (pow_div)
           | Mul(x, Div(1, Sqrt(v)))                                (pow_div_one: the TorchScript exporter's)
           | Mul(x, Reciprocal(Sqrt(v)))                            (pow_reciprocal: torch.rsqrt, dynamo's)
           | Mul(x, Pow(v, -0.5))                                   (pow_rsqrt_pow)
        out = Mul(y, gamma) | Mul(gamma, y)                         (a Cast of x before, of y or gamma after: *_cast)
    It reads per-head q/k norms ([B, S, H, head_dim] normalised over head_dim) the same way: gamma is [head_dim].

    LayerNorm without bias -> LayerNormalization (axis=-1, epsilon, no bias)
        d = Sub(x, ReduceMean(x, axes=[-1])), then the RMS chain above on d, times gamma.

The residual Add + SimplifiedLayerNormalization -> com.microsoft SkipSimplifiedLayerNormalization (its 4th output,
the sum, taking over the Add's consumers) is onnxscript's own rule (fuse_skip_rms: its check accepts an operand whose
shape ONNX shape inference cannot tell, and its new outputs keep the Add's shape), run after these by the fusion
pipeline (ortgate.fix.fusions.FUSION_STEPS).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class NearMiss:
    """onnxscript's MatchingTracer's best partial match of a norm rule that did not fire."""

    rule: str
    node: str  # the node the pattern was rooted at
    reason: str

    def say(self) -> str:
        rule = f"the closest rule, {self.rule}, " if self.rule else ""
        return f"{rule}stopped at {self.node}: {self.reason}"


def _rules():
    import onnx_ir as ir
    from onnxscript.rewriter import _ir_utils, pattern

    float_types = frozenset([ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE])
    compute_types = frozenset([ir.DataType.FLOAT, ir.DataType.DOUBLE])

    def last_axis(axes, x) -> bool:
        value = _ir_utils.get_numpy_value(axes) if axes is not None else None
        if value is None:
            return False
        items = [int(a) for a in value.reshape(-1).tolist()]
        rank = x.shape.rank() if x is not None and x.shape is not None else None
        return items == [-1] or (rank is not None and items == [rank - 1])

    def reduce_ok(node) -> bool:
        return (node.attributes.get_int("keepdims", 1) == 1
                and node.attributes.get_int("noop_with_empty_axes", 0) == 0)

    class NormForm(pattern.RewriteRuleClassBase):
        def __init__(self, name: str, *, centered: bool, gamma_first: bool):
            super().__init__(name)
            self._centered = centered
            self._gamma_first = gamma_first

        def pattern(self, op, x, scale, epsilon, axes, axes2, one, half, compute_dtype, target_dtype, scale_dtype):
            if self._centered:
                mean = op.ReduceMean(x, axes2, _outputs=["mean"])
                d = op.Sub(x, mean)
            else:
                d = pattern.OrValue([op.Cast(x, to=compute_dtype), x])
            square = pattern.OrValue([op.Pow(d, 2.0), op.Mul(d, d)])
            mean_square = op.ReduceMean(square, axes, _outputs=["mean_square"])
            variance = pattern.OrValue([op.Add(mean_square, epsilon), op.Add(epsilon, mean_square)])
            rms = op.Sqrt(variance)
            normalized = pattern.OrValue([
                op.Div(d, rms),
                op.Mul(d, op.Reciprocal(rms)),
                op.Mul(op.Reciprocal(rms), d),
                op.Mul(d, op.Div(one, rms)),
                op.Mul(op.Div(one, rms), d),
                op.Mul(d, op.Pow(variance, half)),
                op.Mul(op.Pow(variance, half), d),
            ])
            normalized = pattern.OrValue([op.Cast(normalized, to=target_dtype), normalized])
            scale = pattern.OrValue([op.Cast(scale, to=scale_dtype), scale])
            return op.Mul(scale, normalized) if self._gamma_first else op.Mul(normalized, scale)

        def check(self, context, x, scale, epsilon, axes, axes2, one, half, compute_dtype, mean_square, mean=None,
                  **_):
            result = pattern.MatchResult()
            eps = _ir_utils.get_singleton_value(epsilon)
            if not isinstance(eps, float):
                return result.fail("epsilon is not a constant float scalar", epsilon)
            if one is not None and _ir_utils.get_singleton_value(one) != 1.0:
                return result.fail("Div(c, Sqrt(.)) with c != 1 is not a reciprocal", one)
            if half is not None and _ir_utils.get_singleton_value(half) != -0.5:
                return result.fail("Pow(v, p) with p != -0.5 is not 1/sqrt", half)
            if x.dtype not in float_types:
                return result.fail("input is not a float type", x)
            if scale.dtype not in float_types:
                return result.fail("scale is not a float type", scale)
            if not last_axis(axes, x) or not reduce_ok(mean_square.producer()):
                return result.fail("the mean of squares is not over the last axis with keepdims=1", mean_square)
            if self._centered and (not last_axis(axes2, x) or not reduce_ok(mean.producer())):
                return result.fail("the mean subtracted is not over the last axis with keepdims=1", mean)
            # gamma scales the normalised axis only: [D] (or [1, ..., D]), D the input's last dim where it is known
            shape = scale.shape
            if shape is None or shape.rank() < 1 or any(d != 1 for d in list(shape)[:-1]):
                return result.fail("scale is not a vector over the normalised axis (shape [D])", scale)
            width = shape[-1]
            last = x.shape[-1] if x.shape is not None and x.shape.rank() else None
            if not isinstance(width, int) or (isinstance(last, int) and last != width):
                return result.fail(f"scale width {width} is not the input's last dim {last}", scale)
            if self._centered:
                if x.dtype not in compute_types or scale.dtype != x.dtype:
                    return result.fail("LayerNormalization needs float or double input and a scale of its type", x)
                self._stash = x.dtype
            else:
                self._stash = compute_dtype.as_int() if compute_dtype is not None else x.dtype
                if self._stash not in compute_types:
                    return result.fail("the normalisation is computed in neither float nor double", x)
            self._eps = eps
            self._flat_scale = shape.rank() > 1
            return result

        def rewrite(self, op, x, scale, **_):
            if self._flat_scale:
                scale = op.Reshape(scale, op.Constant(value_ints=[-1]))
            if self._centered:
                return op.LayerNormalization(x, scale, axis=-1, epsilon=self._eps, stash_type=int(self._stash))
            # ORT's SimplifiedLayerNormalization lives in the ONNX domain (as onnxscript writes it)
            return op.SimplifiedLayerNormalization(x, scale, axis=-1, epsilon=self._eps, stash_type=int(self._stash))

    class NoScale(pattern.RewriteRuleClassBase):
        """An RMSNorm with no gamma (Llama-4's q/k L2 norm): the same chain, ending at the normalised value."""

        def __init__(self, name: str, form: str):
            super().__init__(name)
            self._form = form  # the last node: Div(x, rms) | Mul(x, 1/rms) | Mul(1/rms, x)

        def pattern(self, op, x, epsilon, axes, one, half, compute_dtype):
            d = pattern.OrValue([op.Cast(x, to=compute_dtype), x])
            square = pattern.OrValue([op.Pow(d, 2.0), op.Mul(d, d)])
            mean_square = op.ReduceMean(square, axes, _outputs=["mean_square"])
            variance = pattern.OrValue([op.Add(mean_square, epsilon), op.Add(epsilon, mean_square)])
            rms = op.Sqrt(variance)
            if self._form == "div":
                return op.Div(d, rms)
            inverse = pattern.OrValue([op.Reciprocal(rms), op.Div(one, rms), op.Pow(variance, half)])
            return op.Mul(d, inverse) if self._form == "x_first" else op.Mul(inverse, d)

        def check(self, context, x, epsilon, axes, one, half, compute_dtype, mean_square, **_):
            result = pattern.MatchResult()
            eps = _ir_utils.get_singleton_value(epsilon)
            if not isinstance(eps, float):
                return result.fail("epsilon is not a constant float scalar", epsilon)
            if one is not None and _ir_utils.get_singleton_value(one) != 1.0:
                return result.fail("Div(c, Sqrt(.)) with c != 1 is not a reciprocal", one)
            if half is not None and _ir_utils.get_singleton_value(half) != -0.5:
                return result.fail("Pow(v, p) with p != -0.5 is not 1/sqrt", half)
            if x.dtype not in compute_types or compute_dtype is not None:
                return result.fail("an unscaled norm is fused only in float or double, without Casts", x)
            if not last_axis(axes, x) or not reduce_ok(mean_square.producer()):
                return result.fail("the mean of squares is not over the last axis with keepdims=1", mean_square)
            width = x.shape[-1] if x.shape is not None and x.shape.rank() else None
            if not isinstance(width, int):
                return result.fail("the normalised width (the input's last dim) is not known", x)
            self._eps, self._width, self._dtype = eps, width, x.dtype
            return result

        def rewrite(self, op, x, **_):
            import numpy as np

            ones = op.Constant(value=ir.tensor(np.ones(self._width, self._dtype.numpy())))
            return op.SimplifiedLayerNormalization(x, ones, axis=-1, epsilon=self._eps, stash_type=int(self._dtype))

    layer_norm = [NormForm.rule(f"LayerNormNoBias{i}", centered=True, gamma_first=g) for i, g in enumerate((True, False))]
    rms = [NormForm.rule(f"RmsNormForms{i}", centered=False, gamma_first=g) for i, g in enumerate((True, False))]
    return pattern.RewriteRuleSet(layer_norm), pattern.RewriteRuleSet(rms), pattern.RewriteRuleSet(
        [NoScale.rule(f"RmsNormNoScale_{form}", form) for form in ("div", "x_first", "inverse_first")])


def fuse_layer_norms(ir_model) -> int:
    """LayerNorm without bias -> LayerNormalization; run before any RMSNorm rule (its inner chain is an RMS chain over
    x - mean(x), which an RMSNorm rule would fuse on its own). Returns the nodes written."""
    return int(_rules()[0].apply_to_model(ir_model) or 0)


def fuse_rms_forms(ir_model) -> int:
    """Every RMSNorm spelling above -> SimplifiedLayerNormalization; then, in a pass of its own (a scaled norm's
    chain must not be taken without its gamma), one with no gamma, scaled by ones. Returns the nodes written."""
    rules = _rules()
    return int(rules[1].apply_to_model(ir_model) or 0) + int(rules[2].apply_to_model(ir_model) or 0)


def near_misses(ir_model, node_names: set[str]) -> dict[str, NearMiss]:
    """Per node named in `node_names` (a norm left decomposed: its last node, where every norm rule's pattern is
    rooted), the best partial match among ortgate's and onnxscript's norm rules, from onnxscript's MatchingTracer:
    which rule came closest and why it stopped. Nothing is rewritten (try_rewrite only tries)."""
    from onnxscript.rewriter import _basics
    from onnxscript.rewriter.ort_fusions.rms_normalization import rms_normalization_rules

    layer_norm, rms, unscaled = _rules()
    rules = [*layer_norm.rules, *rms.rules, *unscaled.rules, *rms_normalization_rules]
    out: dict[str, NearMiss] = {}
    for node in ir_model.graph:
        if node.name not in node_names:
            continue
        tracer = _basics.MatchingTracer()
        for rule in rules:
            rule.try_rewrite(ir_model, ir_model.graph, node, tracer=tracer)
        best = None
        for rule, matches in tracer.best_matches_map.items():
            for info in matches:
                if best is None or info.score() > best[1].score():
                    best = (rule, info)
        if best is None:
            out[node.name] = NearMiss("", node.name, f"no norm rule's pattern ends in a {node.op_type} like this one")
            continue
        rule, info = best
        where = [getattr(x, "name", None) or "" for x in info.match_result.failure_nodes_and_values]
        at = f" (at {', '.join(w for w in where if w)})" if any(where) else ""
        out[node.name] = NearMiss(rule.name or "", node.name, f"{info.match_result.reason or 'no match'}{at}")
    return out


def fuse_skip_rms(ir_model) -> int:
    """Residual Add + SimplifiedLayerNormalization -> com.microsoft SkipSimplifiedLayerNormalization: onnxscript's
    rules, whose new outputs are given the Add's shape and type. onnxscript's check wants [B, S, D] shapes on the
    Add's inputs, and the sum a fused node passes on to the next residual Add has none (ONNX shape inference does not
    know the com.microsoft op): without this, every other residual norm of a decoder would be left."""
    from onnxscript.rewriter import pattern
    from onnxscript.rewriter.ort_fusions.skip_normalization import SkipRmsNormFusion

    class KeepShapes(SkipRmsNormFusion):
        def check(self, op, input, skip, gamma, bias, simplified_layer_norm, **kwargs):
            # onnxscript's check, except that an operand whose shape ONNX shape inference could not tell (the output
            # of a com.microsoft node, such as MoE's, before a Reshape) is taken to be the other's: a residual Add
            # adds two [B, S, D] streams. Only two known shapes that differ stop it; the whole-model verification
            # runs the delivered graph at batch 1 and 2.
            result = pattern.MatchResult()
            width = gamma.shape[-1] if gamma.shape is not None and gamma.shape.rank() == 1 else None
            if not isinstance(width, int):
                return result.fail("gamma is not a vector of known width", gamma)
            known = [v.shape for v in (input, skip) if v.shape is not None]
            if not known:
                return result.fail("neither operand of the residual Add has a known shape", input)
            for shape in known:
                if shape.rank() != 3 or shape[-1] != width:
                    return result.fail(f"a residual operand has shape {shape}, not [B, S, {width}]", input)
            if len(known) == 2 and list(known[0]) != list(known[1]):
                return result.fail(f"the residual Add broadcasts ({known[0]} + {known[1]})", input)
            if bias is not None and (bias.shape is None or list(bias.shape) != [width]):
                return result.fail(f"the bias is not [{width}]", bias)
            if simplified_layer_norm.producer().attributes.get_int("stash_type", 1) != 1:
                return result.fail("stash_type is not float")
            return result

        def rewrite(self, op, input, skip, gamma, bias, simplified_layer_norm, **kwargs):
            normalized, skip_sum = super().rewrite(op, input, skip, gamma, bias, simplified_layer_norm, **kwargs)
            for value, like in ((normalized, simplified_layer_norm), (skip_sum, input)):
                if value.shape is None and like.shape is not None:
                    value.shape = like.shape
                if value.type is None and like.type is not None:
                    value.type = like.type
            return normalized, skip_sum

    rules = [KeepShapes.rule("SkipRmsNormPreBias", has_bias=True, bias_pre_add=True),
             KeepShapes.rule("SkipRmsNormBias", has_bias=True, bias_pre_add=False),
             KeepShapes.rule("SkipRmsNorm", has_bias=False)]
    return int(pattern.RewriteRuleSet(rules).apply_to_model(ir_model) or 0)
