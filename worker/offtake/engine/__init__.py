"""The engine: poll loop, offset tracking, backpressure, rebalance and shutdown.

Its words (backpressure, slow down, delivery mode, policy, settle) each name one idea, listed
once in docs/architecture.md, section "Vocabulary: one word per idea".
"""
