"""Run a validation matrix one case per process, so that a case that crashes, hangs or runs the device out of memory
costs that case alone, and write the report of every case that finished.

    python scripts/validate_cases.py configs/validation/matrix.yaml --out docs/validation/gpu/ --timeout 240

Each case runs as `python -m kvplan validate --matrix <that case> --json`; its JSON is appended to
OUT/cases.jsonl as it finishes (a run cut short keeps what it had), then OUT/validation.json and validation.md are
written as `kvplan validate --report` writes them. A case that fails to run is listed with its exit code and the
last line it printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kvplan.validate.matrix import write_report
from kvplan.validate.run import ComponentResult

ROW_FIELDS = ("model", "batch", "seq_len", "dtype", "component", "predicted_bytes", "measured_bytes", "scaled",
              "layers", "device", "note", "band_bytes", "tokens", "missing")


def _row(d: dict) -> ComponentResult:
    values = {k: d.get(k) for k in ROW_FIELDS}
    for k in ("predicted_bytes", "measured_bytes", "band_bytes"):
        values[k] = values[k] or 0
    values["note"] = values["note"] or ""
    values["missing"] = values["missing"] or ""
    return ComponentResult(**values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("matrix", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=int, default=300, help="seconds one case may run (default 300)")
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()
    raw = yaml.safe_load(args.matrix.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "cases.jsonl"
    device: dict = {}
    rows: list[ComponentResult] = []
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(raw["cases"]):
            one = Path(tmp) / f"case{i}.yaml"
            # relative model paths stay relative to the matrix's folder
            if isinstance(case.get("model"), str) and case["model"].startswith("."):
                case = dict(case, model=str((args.matrix.parent / case["model"]).resolve()))
            one.write_text(yaml.safe_dump({"cases": [case]}))
            start = time.monotonic()
            cmd = [sys.executable, "-m", "kvplan", "validate", "--matrix", str(one), "--json",
                   "--tolerance", str(args.tolerance)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                code, out, err = done.returncode, done.stdout, done.stderr
            except subprocess.TimeoutExpired:
                code, out, err = None, "", f"timed out after {args.timeout} s"
            took = time.monotonic() - start
            if code in (0, 1) and out.strip():
                report = json.loads(out)
                device = report["device"]
                rows += [_row(c) for c in report["cases"]]
                entry = {"case": case, "seconds": round(took, 1), "exit": code, "report": report}
            else:
                last = next((ln for ln in reversed((err or out).strip().splitlines()) if ln.strip()), "")
                failures.append(f"{case['model']}: exit {code}: {last}")
                entry = {"case": case, "seconds": round(took, 1), "exit": code, "error": (err or out)[-4000:]}
            with log.open("a") as fh:
                fh.write(json.dumps(entry) + "\n")
            print(f"{case['model']}: exit {code} in {took:.1f} s", flush=True)
    if rows:
        write_report(args.out, device, rows, args.tolerance)
    for f in failures:
        print("FAILED", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
