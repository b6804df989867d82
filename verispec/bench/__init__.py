"""Benchmarking: prompt sets (workloads), speculative-decoding economics and simulation."""
