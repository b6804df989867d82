"""The mechanism of one speculative step, on token ids only: feed, forward, verify, roll back,
stop (sequence.py), the rejection sampler (rejection.py), token trees (tree.py,
token_tree.py), sampling and logit processors, grammars, stopping and the KV cache.
No clock and no policy: how much to draft is decided in verispec.policy."""
