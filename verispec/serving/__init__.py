"""`verispec serve`: a continuous-batching scheduler over step-wise speculative
requests (scheduler.py, cost.py) behind an OpenAI-compatible HTTP server
(server.py, protocol.py, metrics.py)."""
