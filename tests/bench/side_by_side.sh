#!/usr/bin/env bash
# jetfleet and NVIDIA Dynamo 1.6.1, one after the other on this machine, same client, same model.
#
#   ANCHOR_DIR=../shared/anchors/dynamo bash tests/bench/side_by_side.sh short|long [REPS]
#
# short: 1 mocker at speedup 1000, 512-token prompts, 64 streamed tokens, concurrency 1/16/64,
#        the anchor's load client (loadgen.py); each system gets one unmeasured c=1 level first
#        (the first seconds after a start run slow on these machines, for both systems).
# long:  4 mockers at speedup 1, tests/bench/long_prompts.py (fresh 16k-token prompts and
#        repeated 12k-token heads, concurrency 12) against Dynamo (--url) and jetfleet with 1
#        and 2 frontend processes.
# Needs the anchor installed ($ANCHOR_DIR/install.sh, make_model.py). Prints one JSON line a run.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-short}; REPS=${2:-2}
ANCHOR_DIR=${ANCHOR_DIR:-../shared/anchors/dynamo}
ANCHOR=${ANCHOR:-${TMPDIR:-/tmp}/anchor-dynamo}
PY=${PY:-.venv/bin/python}
MODEL=$ANCHOR/model; LONG=$ANCHOR/model-long

long_model() {  # the anchor's model dir with a 131072-token context
  [ -d "$LONG" ] && return
  cp -r "$MODEL" "$LONG"
  "$PY" - "$LONG" <<'PYEOF'
import json, sys
d = sys.argv[1]
for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
    p = f"{d}/{name}"; c = json.load(open(p)); c[key] = 131072; json.dump(c, open(p, "w"), indent=1)
PYEOF
}

load() {  # label url frontend_pid concurrency [warm]
  local n=$(( $4 * 40 > 400 ? $4 * 40 : 400 )) out
  out=$(mktemp -d)
  python3 "$ANCHOR_DIR/loadgen.py" --url "$2" --model anchor-model --words "$MODEL/words.txt" \
    --workload fixed --prompt-tokens 512 --max-tokens 64 --concurrency "$4" --requests "$n" \
    --warmup 20 --pid "frontend=$3" --out "$out" > /dev/null 2>&1
  [ "${5:-}" = warm ] && return
  python3 - "$1" "$4" "$out/summary.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[3]))
print(json.dumps({"system": sys.argv[1], "concurrency": int(sys.argv[2]),
  "req_per_s": round(d["req_per_s"], 1), "ttft_ms_p50": round(d["ttft_ms"]["p50"], 2),
  "ttft_ms_p99": round(d["ttft_ms"]["p99"], 2), "errors": d["errors"],
  "frontend_cpu_pct": round(d["cpu_pct_of_one_core"]["frontend"], 1)}))
PYEOF
}

dynamo_up() {  # workers speedup model
  (cd "$ANCHOR_DIR" && MODEL=$3 MOCKER_ARGS="--num-gpu-blocks-override 16384 --block-size 64" \
    ./start_stack.sh "$1" "$2" kv > /dev/null)
  grep frontend= "$ANCHOR/run/pids" | cut -d= -f2
}
dynamo_down() { (cd "$ANCHOR_DIR" && ./stop_stack.sh > /dev/null 2>&1) || true; }

jetfleet_up() {  # workers speedup model frontends -> sets JF_URL JF_PID
  local info; info=$(mktemp)
  "$PY" -m tests.bench.hold_fleet --model-dir "$3" --workers "$1" --speedup "$2" \
    --frontends "$4" > "$info" 2> /dev/null &
  JF_HOLD=$!
  for _ in $(seq 1 120); do grep -q url "$info" 2> /dev/null && break; sleep 0.5; done
  JF_URL=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['url'])" "$info")
  JF_PID=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pids']['frontend'])" "$info")
}
jetfleet_down() { kill -TERM "$JF_HOLD"; wait "$JF_HOLD" || true; }

if [ "$MODE" = short ]; then
  for _ in $(seq 1 "$REPS"); do
    pid=$(dynamo_up 1 1000 "$MODEL")
    load dynamo http://127.0.0.1:8000 "$pid" 1 warm
    for c in 1 16 64; do load dynamo http://127.0.0.1:8000 "$pid" "$c"; done
    dynamo_down
    jetfleet_up 1 1000 "$MODEL" 1
    load jetfleet "$JF_URL" "$JF_PID" 1 warm
    for c in 1 16 64; do load jetfleet "$JF_URL" "$JF_PID" "$c"; done
    jetfleet_down
  done
else
  long_model
  for _ in $(seq 1 "$REPS"); do
    pid=$(dynamo_up 4 1 "$LONG")
    "$PY" -m tests.bench.long_prompts --url http://127.0.0.1:8000 --model anchor-model \
      --pid "frontend=$pid" --words "$LONG/words.txt" --requests 240 2>&1 >/dev/null | grep '"workload"' | sed 's/^{/{"system": "dynamo", /'
    dynamo_down
    for n in 1 2; do
      "$PY" -m tests.bench.long_prompts --model-dir "$LONG" --model anchor-model \
        --words "$LONG/words.txt" --requests 240 --frontends "$n" 2>&1 >/dev/null | grep '"workload"' | sed "s/^{/{\"system\": \"jetfleet-$n-frontend\", /"
    done
  done
fi
