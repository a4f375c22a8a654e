#!/usr/bin/env bash
# Coverage-guided fuzzing (atheris/libFuzzer) of every decoder: N inputs per target.
#
#   ./scripts/fuzz.sh                          # every target, 1,000,000 inputs each, one at a time
#   ./scripts/fuzz.sh -n 100000 -j 2 records frames
#
# -n N     inputs per target (libFuzzer -runs=N; default 1000000, or $FUZZ_RUNS)
# -j J     targets run at the same time (default 1)
# -s SEED  libFuzzer -seed (default 1: a rerun explores the same way)
# targets: records frames sync_session ops http dm3 (default: all)
#
# Each target starts from its seed corpus (tests/fuzz/corpus/<target>, read only) and a fresh
# working corpus; new inputs, crash artifacts and the log go to bench-results/fuzz/<target>/.
# Prints per target: inputs run, seconds, exec/s, coverage edges (libFuzzer's "cov"), crashes;
# saves the table to bench-results/fuzz.json. Exits 1 if any target crashed or stopped early.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${FUZZ_RUNS:-1000000}
JOBS=1
SEED=1
while getopts "n:j:s:" opt; do
  case $opt in
    n) RUNS=$OPTARG ;;
    j) JOBS=$OPTARG ;;
    s) SEED=$OPTARG ;;
    *) sed -n 2,17p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(records frames sync_session ops http dm3)

PY=.venv/bin/python
if ! "$PY" -c "import atheris" 2>/dev/null; then
  echo "atheris is not installed: run ./scripts/setup.sh (it is in the test extras)" >&2
  exit 2
fi
OUT=bench-results/fuzz
mkdir -p "$OUT"

run_target() {
  local target=$1 dir=$OUT/$1 max_len=8192
  [ "$target" = sync_session ] && max_len=16384  # its seeds hold two frames of up to 4 KB
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/tmp"
  local start end rc=0
  start=$(date +%s.%N)
  # New inputs go to the first corpus directory; the committed seeds are only read.
  TMPDIR=$PWD/$dir/tmp "$PY" "tests/fuzz/fuzz_$target.py" \
    -runs="$RUNS" -seed="$SEED" -max_len=$max_len -timeout=30 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" "tests/fuzz/corpus/$target" \
    >"$dir/fuzz.log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  rm -rf "$dir/tmp"
  echo "$rc $start $end" >"$dir/run"
  echo "$target: exit $rc after $(awk "BEGIN {printf \"%.1f\", $end - $start}") s (log: $dir/fuzz.log)"
}

echo "fuzzing ${TARGETS[*]}: $RUNS inputs each, $JOBS at a time, seed $SEED"
running=0
for target in "${TARGETS[@]}"; do
  run_target "$target" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

"$PY" - "$RUNS" "$JOBS" "$SEED" "${TARGETS[@]}" <<'EOF'
import json, platform, re, sys, time
from pathlib import Path

runs, jobs, seed, targets = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
out = Path("bench-results/fuzz")
rows = []
for target in targets:
    d = out / target
    rc, start, end = d.joinpath("run").read_text().split()
    log = d.joinpath("fuzz.log").read_text(errors="replace")
    stat = dict(re.findall(r"^stat::(\w+):\s*(\d+)", log, re.M))
    progress = re.findall(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)", log, re.M)
    seconds = float(end) - float(start)
    inputs = int(stat.get("number_of_executed_units", progress[-1][0] if progress else 0))
    crashes = sorted(p.name for p in d.joinpath("artifacts").iterdir())
    rows.append({
        "target": target,
        "requested": runs,
        "inputs": inputs,
        "seconds": round(seconds, 1),
        "exec_per_s": round(inputs / seconds) if seconds else 0,
        "edges": int(progress[-1][1]) if progress else 0,
        "features": int(progress[-1][2]) if progress else 0,
        "corpus_added": int(stat.get("new_units_added", 0)),
        "peak_rss_mb": int(stat.get("peak_rss_mb", 0)),
        "crashes": len(crashes),
        "artifacts": crashes,
        "exit_code": int(rc),
        "complete": int(rc) == 0 and inputs >= runs,
    })
header = f"{'target':<13} {'inputs':>10} {'seconds':>9} {'exec/s':>8} {'edges':>6} {'crashes':>7}"
print()
print(header)
print("-" * len(header))
for r in rows:
    note = "" if r["complete"] else f"  (stopped: exit {r['exit_code']}, see {out / r['target']})"
    print(f"{r['target']:<13} {r['inputs']:>10,} {r['seconds']:>9.1f} {r['exec_per_s']:>8,} "
          f"{r['edges']:>6} {r['crashes']:>7}{note}")
summary = {
    "tool": "atheris (libFuzzer)",
    "runs_per_target": runs, "jobs": jobs, "seed": seed,
    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
    "targets": rows,
}
path = Path("bench-results/fuzz.json")
if path.exists():  # a partial rerun (some targets) keeps the other targets' last results
    old = json.loads(path.read_text())
    kept = [r for r in old.get("targets", []) if r["target"] not in targets]
    summary["targets"] = kept + rows
path.write_text(json.dumps(summary, indent=2) + "\n")
print(f"\nsaved {path}")
sys.exit(0 if all(r["complete"] and not r["crashes"] for r in rows) else 1)
EOF
