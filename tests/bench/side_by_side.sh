#!/usr/bin/env bash
# jetfleet and NVIDIA Dynamo 1.6.1, one after the other on this machine, same client, same model.
#
#   ANCHOR_DIR=../shared/anchors/dynamo bash tests/bench/side_by_side.sh short|tokens|long|trace [REPS]
#
# short: 1 mocker at speedup 1000, 512-token prompts, 64 streamed tokens, the anchor's load
#        client (loadgen.py). Per sitting, one system after the other: Dynamo (its default block
#        64), `jetfleet up` as the README starts it with --block-size 64 (equal blocks), and
#        `jetfleet up` on its defaults (block 16); up keeps its planner, held to the one worker
#        Dynamo has (--max-replicas agg=1). Each system is measured cold first (c=16 right after
#        start, no warm-up: what a user meets), then warm at c=1/16/64 (20 unmeasured requests
#        before each); every run sends prompts no run sent before (the same ones to each
#        system). cpu_ms_per_req: CPU of every process of the system (Dynamo: its frontend and
#        mocker; jetfleet: up and everything it started, NATS and Redis included) over the
#        measured window, per request.
# tokens: the cost of a streamed token: c=16, 512-token prompts, 16 and then 256 tokens out on
#        Dynamo and on `jetfleet up --block-size 64`; cpu_ms_per_token is the whole system's CPU per
#        request at 256 minus at 16, over 240. UP=/path/to/.venv/bin/jetfleet runs another checkout.
# long:  4 mockers at speedup 1, tests/bench/long_prompts.py (fresh 16k-token prompts and
#        repeated 12k-token heads, concurrency 12) against Dynamo (--url) and jetfleet with 1
#        and 2 frontend processes.
# trace: 4 mockers at speedup 1, tests/bench/trace_replay.py (a production trace replayed open
#        loop at its own arrival times, long raw prompts sharing prefixes) against Dynamo (--url)
#        and jetfleet; TRACE=path to Mooncake's conversation_trace.jsonl (see docs/benchmarks.md),
#        SECONDS_OF_TRACE=seconds of the trace (150) from SLICE_START (0), prompts cut to
#        MAX_PROMPT tokens (126976: the long model's 131072 context less the longest output);
#        DUMP_DIR=a directory for one JSON line a request (dynamo-N.jsonl, jetfleet-N.jsonl).
# Needs the anchor installed ($ANCHOR_DIR/install.sh, make_model.py). Prints one JSON line a run.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-short}; REPS=${2:-2}
ANCHOR_DIR=${ANCHOR_DIR:-../shared/anchors/dynamo}
ANCHOR=${ANCHOR:-${TMPDIR:-/tmp}/anchor-dynamo}
PY=${PY:-.venv/bin/python}
UP=${UP:-.venv/bin/jetfleet}
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

SITTING=0
load() {  # label url concurrency cold|warm name=pid...
  local label=$1 url=$2 c=$3 warm=$4 n out seed; shift 4
  local pids=(); for p in "$@"; do pids+=(--pid "$p"); done
  n=$(( c * 40 > 400 ? c * 40 : 400 )); out=$(mktemp -d)
  # fresh prompts in every run (loadgen's default seed repeats them: a run after the first then
  # meets prompts the fleet has tokenized and cached, and "cold" would differ from "warm" by
  # that, not by warmth); the same prompts for every system of a sitting
  seed=$(( SITTING * 1000000 + c * 1000 + ${TOKENS:-64} + ($([ "$warm" = cold ] && echo 500 || echo 0)) ))
  python3 "$ANCHOR_DIR/loadgen.py" --url "$url" --model anchor-model --words "$MODEL/words.txt" \
    --workload fixed --prompt-tokens 512 --max-tokens "${TOKENS:-64}" --concurrency "$c" --requests "$n" \
    --warmup "$([ "$warm" = cold ] && echo 0 || echo 20)" --seed "$seed" "${pids[@]}" --out "$out" > /dev/null 2>&1
  python3 - "$label" "$c" "$warm" "$out/summary.json" "$seed" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[4]))
cpu = d["cpu_pct_of_one_core"]
print(json.dumps({"system": sys.argv[1], "concurrency": int(sys.argv[2]), "phase": sys.argv[3],
  "seed": int(sys.argv[5]), "output_tokens": d["params"]["max_tokens"],
  "req_per_s": round(d["req_per_s"], 1), "ttft_ms_p50": round(d["ttft_ms"]["p50"], 2),
  "ttft_ms_p99": round(d["ttft_ms"]["p99"], 2), "errors": d["errors"],
  "cpu_ms_per_req": round(10 * sum(cpu.values()) / d["req_per_s"], 3),
  "cpu_pct_of_one_core": {k: round(v, 1) for k, v in cpu.items()}}))
PYEOF
}

sitting() {  # label url name=pid...: cold c=16, then warm c=1/16/64
  local label=$1 url=$2; shift 2
  load "$label" "$url" 16 cold "$@"
  for c in 1 16 64; do load "$label" "$url" "$c" warm "$@"; done
}

dynamo_up() {  # workers speedup model -> sets DYN (name=pid of each of its processes)
  (cd "$ANCHOR_DIR" && MODEL=$3 MOCKER_ARGS="--num-gpu-blocks-override 16384 --block-size 64" \
    ./start_stack.sh "$1" "$2" kv > /dev/null)
  mapfile -t DYN < "$ANCHOR/run/pids"
}
dynamo_down() { (cd "$ANCHOR_DIR" && ./stop_stack.sh > /dev/null 2>&1) || true; }

up_start() {  # extra up flags... -> sets UP_PID UP_URL (jetfleet up as the README starts it)
  local port state; port=$("$PY" -c "from infra.embedded import free_port; print(free_port())")
  state=$(mktemp -d)
  "$UP" up --model "$MODEL" --served-model-name anchor-model --workers 1 \
    --speedup 1000 --num-gpu-blocks 16384 --max-replicas agg=1 --port "$port" \
    --nats-port 0 --redis-port 0 --state-dir "$state" "$@" > "$state/up.out" 2>&1 &
  UP_PID=$!; UP_URL=http://127.0.0.1:$port
  for _ in $(seq 1 240); do grep -q "jetfleet is up" "$state/up.out" && return; sleep 0.25; done
  echo "jetfleet up did not start: $state/up.out" >&2; exit 1
}
up_stop() { kill -INT "$UP_PID"; wait "$UP_PID" || true; }

each_system() {  # measure [defaults]: `measure label url name=pid...` on Dynamo, on
  # `up --block-size 64` and, with "defaults", on up's defaults; one system at a time
  local measure=$1
  dynamo_up 1 1000 "$MODEL"
  "$measure" dynamo http://127.0.0.1:8000 "${DYN[@]}"
  dynamo_down
  up_start --block-size 64
  "$measure" jetfleet-up-block64 "$UP_URL" "up=$UP_PID"
  up_stop
  if [ "${2:-}" = defaults ]; then
    up_start
    "$measure" jetfleet-up-defaults "$UP_URL" "up=$UP_PID"
    up_stop
  fi
}

per_token() {  # label url name=pid...: one JSON line with the CPU a streamed token costs
  local label=$1 url=$2 a b; shift 2
  a=$(TOKENS=16 load "$label" "$url" 16 warm "$@"); b=$(TOKENS=256 load "$label" "$url" 16 warm "$@")
  echo "$a"; echo "$b"
  python3 -c "import json,sys; a,b=(json.loads(x) for x in sys.argv[2:]); print(json.dumps({'system': sys.argv[1], 'cpu_ms_per_token': round((b['cpu_ms_per_req']-a['cpu_ms_per_req'])/240, 4)}))" "$label" "$a" "$b"
}

if [ "$MODE" = short ]; then
  for SITTING in $(seq 1 "$REPS"); do each_system sitting defaults; done
elif [ "$MODE" = tokens ]; then
  for SITTING in $(seq 1 "$REPS"); do each_system per_token; done
elif [ "$MODE" = trace ]; then
  long_model
  summary() {  # label: the replay's JSON line (stdin, after what the fleet printed) -> one line
    python3 -c "import json,sys; d=json.loads([l for l in sys.stdin if l.startswith('{')][-1]); d['system']=sys.argv[1]; print(json.dumps(d))" "$1"
  }
  replay=("$PY" -m tests.bench.trace_replay --trace "${TRACE:?TRACE=conversation_trace.jsonl}"
    --seconds "${SECONDS_OF_TRACE:-150}" --start "${SLICE_START:-0}"
    --max-prompt-tokens "${MAX_PROMPT:-126976}" --words "$LONG/words.txt" --model anchor-model)
  for rep in $(seq 1 "$REPS"); do
    dump() { [ -n "${DUMP_DIR:-}" ] && echo "--dump $DUMP_DIR/$1-$rep.jsonl"; true; }
    dynamo_up 4 1 "$LONG"
    "${replay[@]}" --url http://127.0.0.1:8000 $(printf -- '--pid %s ' "${DYN[@]}") $(dump dynamo) 2>/dev/null | summary dynamo
    dynamo_down
    "${replay[@]}" --model-dir "$LONG" $(dump jetfleet) 2>/dev/null | summary jetfleet
  done
else
  long_model
  for _ in $(seq 1 "$REPS"); do
    dynamo_up 4 1 "$LONG"
    "$PY" -m tests.bench.long_prompts --url http://127.0.0.1:8000 --model anchor-model \
      $(printf -- '--pid %s ' "${DYN[@]}") --words "$LONG/words.txt" --requests 240 2>&1 >/dev/null | grep '"workload"' | sed 's/^{/{"system": "dynamo", /'
    dynamo_down
    for n in 1 2; do
      "$PY" -m tests.bench.long_prompts --model-dir "$LONG" --model anchor-model \
        --words "$LONG/words.txt" --requests 240 --frontends "$n" 2>&1 >/dev/null | grep '"workload"' | sed "s/^{/{\"system\": \"jetfleet-$n-frontend\", /"
    done
  done
fi
