"""Binary byte units, for messages and for the few figures written in GiB (vLLM logs, estimates).
kvplan computes in integer bytes; these convert at the edges."""

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
