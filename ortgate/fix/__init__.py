"""`ortgate fix`: rewrite what the linter diagnoses (unfused MoE, decomposed norms, rotary and attention), prove the
result equal on ONNX Runtime, and write it as a new model folder.

This is the one part of ortgate that reads weight bytes, and it streams them tensor by tensor (one expert's matrices
at a time when it repacks a stacked tensor), so memory stays bounded by the largest tensor, not by the model.
"""
