#!/bin/sh
# Measures `failbus shadow --input` over N outcomes (default 100000) of
# mixed traffic: 200 agents on 8 providers, one outcome a second, 40%
# successes, rate limits with and without a hint, server errors,
# transport errors (an agent stays on its turn until it succeeds, so
# failures in a row spend one retry budget), history refusals, a new
# segment (boundary) per agent every 2000 outcomes.
# Shadowed from max_retries 10 to max_retries 1. Runs RUNS times (default
# 5) and prints each run's outcomes/s and the median.
#
#   sh internal/cli/shadow/testdata/speed.sh [N] [RUNS]
#
# The machine's load counts: quote the median and say what else ran.
set -eu
N=${1:-100000}
RUNS=${2:-5}
dir=$(mktemp -d)
[ -n "${KEEP:-}" ] && echo "keeping $dir" >&2 || trap 'rm -rf "$dir"' EXIT
root=$(cd "$(dirname "$0")/../../../.." && pwd)
(cd "$root" && go build -o "$dir/failbus" ./cmd/failbus)
printf 'retry:\n  max_retries: 10\n' >"$dir/base.yaml"
printf 'retry:\n  max_retries: 1\n' >"$dir/new.yaml"
awk -v n="$N" 'BEGIN {
	t0 = 1772323200 # 2026-03-01T00:00:00Z
	for (i = 0; i < n; i++) {
		at = strftime("%Y-%m-%dT%H:%M:%SZ", t0 + i, 1)
		a = i % 200; r = int(i / 200); k = (7 * a + 3 * r) % 10
		if (r > 0 && r % 10 == 0) # every agent starts a new segment every 10 rounds
			printf "{\"type\":\"boundary\",\"at\":\"%s\",\"agent\":\"a%d\",\"session\":\"s%d\",\"segment\":%d}\n", at, a, a, r / 10
		# an agent stays on its turn until the turn succeeds: failures in a
		# row spend one retry budget
		head = sprintf("{\"type\":\"outcome\",\"id\":\"o-%d\",\"at\":\"%s\",\"agent\":\"a%d\",\"session\":\"s%d\",\"provider\":\"p%d\",\"profile\":\"k%d\",\"turn\":%d,\"step\":1", i, at, a, a, a % 8, a % 3, turn[a])
		if (k < 4)       tail = ",\"ok\":true,\"status\":200}"
		else if (k == 4) tail = ",\"status\":429,\"headers\":{\"retry-after-ms\":\"1200\"}}"
		else if (k == 5) tail = ",\"status\":429}"
		else if (k < 8)  tail = ",\"status\":500,\"body\":\"upstream error\"}"
		else if (k == 8) tail = ",\"status\":0,\"transport_error\":\"read tcp: ECONNRESET\"}"
		else             tail = sprintf(",\"status\":200,\"stop_reason\":\"refusal\",\"refusal_scope\":\"history\",\"segment\":%d}", int(r / 10))
		print head tail
		if (k < 4 || k == 9)
			turn[a]++
	}
}' >"$dir/history.jsonl"
echo "load before: $(uptime)"
rates=""
r=1
while [ "$r" -le "$RUNS" ]; do
	if [ -x /usr/bin/time ]; then
		/usr/bin/time -f "%U %S %M" -o "$dir/cpu" "$dir/failbus" shadow --base "$dir/base.yaml" --policy "$dir/new.yaml" --input "$dir/history.jsonl" | tail -n 1 >"$dir/summary.json"
		cpu=$(awk '{ printf "%.1f s CPU (user+sys), max RSS %d MiB", $1 + $2, $3 / 1024 }' "$dir/cpu")
	else
		"$dir/failbus" shadow --base "$dir/base.yaml" --policy "$dir/new.yaml" --input "$dir/history.jsonl" | tail -n 1 >"$dir/summary.json"
		cpu="CPU not measured (no /usr/bin/time)"
	fi
	rate=$(awk -v n="$N" '{ match($0, /"took_ms":[0-9]+/); ms = substr($0, RSTART + 10, RLENGTH - 10); printf "%.0f", n / (ms / 1000) }' "$dir/summary.json")
	echo "run $r: $(cat "$dir/summary.json")"
	echo "run $r: $rate outcomes/s wall; $cpu"
	rates="$rates $rate"
	r=$((r + 1))
done
echo "$rates" | tr ' ' '\n' | grep . | sort -n | awk -v n="$N" '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "median of %d runs: %.0f outcomes/s (%d outcomes in %.1f s)\n", NR, m, n, n / m }'
echo "load after: $(uptime)"
