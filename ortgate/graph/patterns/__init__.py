"""Graph patterns: each module recognises one structure (MoE blocks, attention cores, norms, rotary, ...).

A pattern starts from the few nodes that can anchor it (looked up in the graph index by op type) and walks
only their neighbourhood, so the cost grows with the graph, never with its square. Results are cached on
the graph: several rules ask the same question.
"""
