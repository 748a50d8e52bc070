"""kvplan: a KV-cache memory planner for LLM serving."""

__version__ = "0.1.0"
