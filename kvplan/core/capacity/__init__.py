"""Capacity planning: per-engine memory budgets, KV blocks, concurrency, the longest context that fits."""
