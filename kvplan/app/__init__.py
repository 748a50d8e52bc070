"""Use cases: one function per command (size, fit, explain, simulate, check), combining the input edges (kvplan.io)
with the pure core (kvplan.core); the commands (kvplan.cli) parse flags, call one of these and render what it
returns. Nothing here prints."""
