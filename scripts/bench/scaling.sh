#!/usr/bin/env bash
# The scaling experiment: data-parallel training over a rate-limited network, W = 2 ranks of one
# thread each, in two network namespaces joined by a veth pair (scripts/netem/), so that all
# gradient traffic crosses a link of known rate. For each model, rate and overlap mode it trains
# on synthetic data and reads rank 0's metrics: step time, exposed communication (the time the
# solver waits for gradient buckets after backward) and
#
#   scaling efficiency = throughput of W ranks / (W x throughput of one rank training alone
#                        with the same thread count and per-rank batch)
#   hidden             = 1 - exposed communication with overlap on / with overlap off
#
# and, as a control, two single-rank trainings side by side without communication: what two
# ranks sharing this machine's cores and memory cost before any byte is sent.
#
# (with overlap off every bucket is all-reduced after backward, so its exposed time is the whole
# communication time), and the machine's CPU time per step by kind (user, system, softirq, idle:
# both ends of the emulated link run on this machine's cores). Communication's CPU is split in
# two: Cortado's own (the communicator thread's CPU time, which each rank measures for its
# buckets and writes to its metrics: what a rank of a real two-host job pays too) and the rest
# of what the machine spends beyond the side-by-side control (the emulation: the other end's
# network stack, veth and tc in softirq and timers, and their interference with compute). The peer, measured in the same rounds over the same link: PyTorch 1.13
# DistributedDataParallel with Gloo (scripts/bench/scaling/ddp_torch.py: the same models, batch,
# thread count and synthetic data; DDP always overlaps, with its default 25 MB buckets).
#
# Every configuration runs --rounds times, interleaved (round 1 of everything, then round 2...),
# and each figure is the median over the rounds with min and max. Raw metrics and a summary go
# to runs/bench-scaling-<time>/ (summary.md is the table for BENCHMARKS.md).
#
#   scripts/bench/scaling.sh [--models resnet20,resnet50] [--rates 100mbit,1gbit,10gbit]
#       [--rounds 3] [--steps resnet20=30,resnet50=4] [--warmup resnet20=5,resnet50=2]
#       [--batch resnet20=64,resnet50=16] [--codecs f32] [--overlap false,true] [--no-torch]
#       [--transports tcp] [--no-alone] [--build DIR] [--prefix cortado-scale]
#
# --codecs runs the 2-rank trainings once per gradient codec (distributed.codec, with nearest
# rounding and batch norm and biases in f32): f32, f16, bf16, epgc11, epgc9, epgc8; epgc11-ef,
# epgc9-ef, epgc8-ef: the same with error feedback, as auto runs its sub-16-bit candidates; or
# auto: planned per bucket from the link measured during the warmup steps (auto_warmup_steps is
# set to --warmup), then tried against the all-narrowest plan, in turns, for 2 x 4 more steps
# (auto_trial_steps); the summary lists the plans kept. With auto among the codecs every run (each
# codec, one rank alone, PyTorch) takes those 8 steps more before its measured ones, so that all
# are measured over the same iterations. Each round starts one codec further on in the list, so
# that no codec always runs first. --overlap picks
# the overlap modes (hidden needs both); --no-alone skips the side-by-side control.
# --transports tcp,ucx runs them over each transport: ucx with UCX_TLS=tcp,self on the veth
# (within one host UCX would take shared memory around the limited link), reported as network
# "<rate>.ucx".
#
# Needs root (network namespaces and tc), iproute2, cmake and a C++ toolchain (it builds
# `cortado` in DIR, default build/), and for the peer /usr/bin/python3 with torch and
# torchvision (scripts/setup.sh --bench). Uses about 7 GB of memory per ResNet-50 rank. The
# namespaces are removed at the end, also on failure or Ctrl-C.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

me=scaling.sh
models=resnet20,resnet50
rates=100mbit,1gbit,10gbit
rounds=3
steps_spec=resnet20=30,resnet50=4
warmup_spec=resnet20=5,resnet50=2
batch_spec=resnet20=64,resnet50=16
codecs=f32
transports=tcp
overlaps=false,true
torch=1
auto_trial=4  # distributed.auto_trial_steps of the auto runs (its default)
alone=1
prefix=cortado-scale
subnet=10.232.0
port=29611

usage() { echo "$me: $*  (see --help)" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --models|--rates|--rounds|--steps|--warmup|--batch|--build|--prefix|--codecs|--overlap|--transports)
      (($# >= 2)) || usage "$1 needs a value"
      case "$1" in
        --models) models=$2 ;;
        --rates) rates=$2 ;;
        --rounds) rounds=$2 ;;
        --steps) steps_spec=$2 ;;
        --warmup) warmup_spec=$2 ;;
        --batch) batch_spec=$2 ;;
        --build) build=$2 ;;
        --prefix) prefix=$2 ;;
        --codecs) codecs=$2 ;;
        --transports) transports=$2 ;;
        --overlap) overlaps=$2 ;;
      esac
      shift 2 ;;
    --no-torch) torch=0; shift ;;
    --no-alone) alone=0; shift ;;
    -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
    *) usage "unknown argument '$1'" ;;
  esac
done

# lookup SPEC MODEL: the value of MODEL in "a=1,b=2".
lookup() {
  local item
  IFS=, read -ra items <<<"$1"
  for item in "${items[@]}"; do
    [[ ${item%%=*} == "$2" ]] && { echo "${item#*=}"; return; }
  done
  usage "no value for model '$2' in '$1'"
}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage "--rounds '$rounds': want a positive integer"
IFS=, read -ra model_list <<<"$models"
IFS=, read -ra rate_list <<<"$rates"
IFS=, read -ra codec_list <<<"$codecs"
IFS=, read -ra transport_list <<<"$transports"
for t in "${transport_list[@]}"; do
  case "$t" in tcp|ucx) ;; *) usage "--transports: want tcp and/or ucx, got '$t'" ;; esac
done
IFS=, read -ra overlap_list <<<"$overlaps"
for c in "${codec_list[@]}"; do
  case "$c" in f32|f16|bf16|epgc11|epgc9|epgc8|epgc11-ef|epgc9-ef|epgc8-ef|auto) ;;
    *) usage "--codecs: unknown codec '$c'" ;; esac
done
for o in "${overlap_list[@]}"; do
  case "$o" in true|false) ;; *) usage "--overlap: want true and/or false, got '$o'" ;; esac
done
for m in "${model_list[@]}"; do
  case "$m" in resnet20|resnet50) ;; *) usage "--models: unknown model '$m' (resnet20, resnet50)" ;; esac
  for spec in "$steps_spec" "$warmup_spec" "$batch_spec"; do
    v=$(lookup "$spec" "$m")
    [[ $v =~ ^[0-9]+$ ]] || usage "'$spec': '$m=$v' is not a whole number"
  done
done

# measured_from MODEL: the steps every run of MODEL takes before its measured ones. With auto
# among the codecs that is the warmup plus auto's trial (2 x auto_trial), for every run alike
# (each codec, one rank alone, PyTorch), so that all are measured over the same iterations.
measured_from() {
  local w; w=$(lookup "$warmup_spec" "$1")
  [[ ",$codecs," == *,auto,* ]] && w=$((w + 2 * auto_trial))
  echo "$w"
}

((EUID == 0)) || { echo "$me: must run as root (network namespaces and tc need it)" >&2; exit 1; }
if ((torch)); then
  "$py" -c 'import torch.distributed, torchvision' 2>/dev/null ||
    { echo "$me: $py cannot import torch and torchvision; run scripts/setup.sh" \
        "--bench, or pass --no-torch" >&2; exit 1; }
fi

# The cortado binary, built (incrementally) from the current source.
bench_cortado --build

out=$root/runs/bench-scaling-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
netem=$root/scripts/netem
cleanup() {
  local rc=$?
  kill $(jobs -p) 2>/dev/null || true
  "$netem/down.sh" --prefix "$prefix" || true
  rm -rf "$out/checkpoints"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

{
  echo "$(bench_machine), $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "# commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "# models $models; rates $rates; rounds $rounds; steps $steps_spec; warmup $warmup_spec; batch $batch_spec; codecs $codecs; overlap $overlaps; transports $transports"
  for m in "${model_list[@]}"; do echo "# $m: measured steps $(($(measured_from "$m") + 1))-$(($(measured_from "$m") + $(lookup "$steps_spec" "$m")))"; done
  if ((torch)); then
    echo "# peer: torch $("$py" -c 'import torch; print(torch.__version__)') DistributedDataParallel, gloo"
  fi
} | tee "$out/info.txt"
bench_load before "$out/info.txt"

# config MODEL WORLD: a synthetic-data training config for the model at its per-rank batch, with
# one metrics record per step and as many samples as one global batch (so the final evaluation
# is a single batch).
config() {
  local model=$1 world=$2 batch steps warmup shape classes
  batch=$(lookup "$batch_spec" "$model")
  steps=$(lookup "$steps_spec" "$model")
  warmup=$(measured_from "$model")
  if [[ $model == resnet50 ]]; then shape="[3, 224, 224]" classes=1000; else shape="[3, 32, 32]" classes=10; fi
  local file=$out/$model.w$world.yaml
  cat >"$file" <<YAML
model: {builder: $model}
data:
  type: synthetic
  batch_size: $batch
  synthetic: {shape: $shape, classes: $classes, samples: $((batch * world))}
solver: {base_lr: 0.01, momentum: 0.9, max_iter: $((steps + warmup)), eval_interval: 0}
checkpoint: {every: 0, keep: 1}
log: {interval: 1}
YAML
  echo "$file"
}

# sample_cpu METRICS WARMUP STEPS OUT: the machine's CPU time over the measured steps, from
# /proc/stat when the metrics file shows WARMUP steps done and again at WARMUP + STEPS, as
# "user system softirq idle" in seconds (user includes nice; system includes irq). Runs in the
# background beside a training; gives up quietly if the run ends first.
sample_cpu() {
  local metrics=$1 from=$2 to=$(($2 + $3)) out=$4 a="" b=""
  snapshot() { awk '/^cpu / { printf "%d %d %d %d\n", $2 + $3, $4 + $7, $8, $5 }' /proc/stat; }
  steps_done() { grep -c '"event":"train"' "$metrics" 2>/dev/null || true; }
  for ((i = 0; i < 36000; i++)); do
    local n; n=$(steps_done); n=${n:-0}
    if [[ -z $a ]] && ((n >= from)); then a=$(snapshot); fi
    if [[ -n $a ]] && ((n >= to)); then b=$(snapshot); break; fi
    sleep 0.1
  done
  [[ -n $a && -n $b ]] || return 0
  local hz; hz=$(getconf CLK_TCK)
  read -r u1 s1 q1 i1 <<<"$a"; read -r u2 s2 q2 i2 <<<"$b"
  awk -v hz="$hz" -v u=$((u2 - u1)) -v s=$((s2 - s1)) -v q=$((q2 - q1)) -v i=$((i2 - i1)) \
    'BEGIN { printf "{\"user_s\":%.2f,\"system_s\":%.2f,\"softirq_s\":%.2f,\"idle_s\":%.2f}\n", u/hz, s/hz, q/hz, i/hz }' >"$out"
}

# One rank alone, one thread: the denominator of the efficiency.
run_single() {  # MODEL ROUND
  local model=$1 round=$2 tag=$1.single.r$2
  local cfg; cfg=$(config "$model" 1)
  echo "== round $round: $model, 1 rank alone" >&2
  sample_cpu "$out/$tag.jsonl" "$(measured_from "$model")" "$(lookup "$steps_spec" "$model")" \
    "$out/$tag.cpu.json" &
  "$cortado" train --config "$cfg" --threads 1 --no-progress --metrics "$out/$tag.jsonl" \
    --set checkpoint.dir="$out/checkpoints/$tag" >"$out/$tag.log" 2>&1 ||
    { echo "$me: $tag failed:" >&2; tail -5 "$out/$tag.log" >&2; exit 1; }
  rm -rf "$out/checkpoints/$tag"
}

# Two single-rank trainings at once, without communication: what sharing the machine alone
# costs (memory bandwidth, caches), the ceiling of a 2-rank run on it.
run_alone_pair() {  # MODEL ROUND
  local model=$1 round=$2 side pids=()
  local cfg; cfg=$(config "$model" 1)
  echo "== round $round: $model, 2 single ranks side by side (no communication)" >&2
  # The machine's CPU while both compute: the base that the 2-rank runs' CPU is compared with.
  sample_cpu "$out/$model.none.alone-a.r$round.jsonl" "$(measured_from "$model")" \
    "$(lookup "$steps_spec" "$model")" "$out/$model.none.alone-a.r$round.cpu.json" &
  for side in a b; do
    local tag=$model.none.alone-$side.r$round
    "$cortado" train --config "$cfg" --threads 1 --no-progress --metrics "$out/$tag.jsonl" \
      --set checkpoint.dir="$out/checkpoints/$tag" >"$out/$tag.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  ((failed == 0)) || { echo "$me: $model side by side failed:" >&2; tail -5 "$out/$model".none.alone-*.r"$round".log >&2; exit 1; }
  rm -rf "$out"/checkpoints/"$model".none.alone-*
}

# Two ranks, one per namespace, one launcher each (node 0 in a hosts the store).
run_pair() {  # MODEL RATE OVERLAP ROUND CODEC TRANSPORT
  local model=$1 rate=$2 overlap=$3 round=$4 codec=$5 transport=$6 net=$2
  [[ $transport == tcp ]] || net=$2.$transport
  local tag=$1.$net.overlap-$3.r$4
  [[ $codec == f32 ]] || tag=$1.$net.codec-$codec.overlap-$3.r$4
  local cfg; cfg=$(config "$model" 2)
  echo "== round $round: $model, 2 ranks at $rate, overlap $overlap, codec $codec, transport $transport" >&2
  local token; token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local pids=() side node auto_args=() feedback=false
  # epgc8-ef etc.: the codec with error feedback, as auto runs its sub-16-bit candidates.
  [[ $codec == *-ef ]] && feedback=true
  # auto plans after the warmup steps and then tries the plan against the all-narrowest one
  # for 2 x auto_trial steps; the measured steps (measured_from) run the plan kept.
  if [[ $codec == auto ]]; then
    auto_args=(--set distributed.auto_warmup_steps="$(lookup "$warmup_spec" "$model")"
      --set distributed.auto_trial_steps="$auto_trial")
  fi
  sample_cpu "$out/$tag.jsonl" "$(measured_from "$model")" "$(lookup "$steps_spec" "$model")" \
    "$out/$tag.cpu.json" &
  for side in a b; do
    node=$([[ $side == a ]] && echo 0 || echo 1)
    CORTADO_JOB_TOKEN=$token UCX_TLS=tcp,self UCX_NET_DEVICES=veth-$side \
      "$netem/exec.sh" "$side" --prefix "$prefix" -- \
      "$cortado" launch --nnodes 2 --node-rank "$node" --nproc 1 --master "$subnet.1:$port" -- \
      "$cortado" train --config "$cfg" --threads 1 --no-progress --metrics "$out/$tag.jsonl" \
      --set checkpoint.dir="$out/checkpoints/$tag" --set distributed.overlap="$overlap" \
      --set distributed.codec="${codec%-ef}" --set distributed.error_feedback="$feedback" \
      --set distributed.transport="$transport" "${auto_args[@]}" >"$out/$tag.node$node.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if ((failed)); then
    echo "$me: $tag failed:" >&2
    tail -5 "$out/$tag".node*.log >&2
    exit 1
  fi
  rm -rf "$out/checkpoints/$tag"
}

# The peer: PyTorch DDP over the same link (world 2), and alone (world 1).
run_torch() {  # MODEL RATE|single ROUND
  local model=$1 rate=$2 round=$3 tag=$1.$2.torch.r$3
  local batch steps warmup
  batch=$(lookup "$batch_spec" "$model"); steps=$(lookup "$steps_spec" "$model")
  warmup=$(measured_from "$model")
  local args=(--model "$model" --batch "$batch" --steps "$steps" --warmup "$warmup")
  echo "== round $round: $model, PyTorch DDP ${rate/single/1 rank alone}" >&2
  if [[ $rate == single ]]; then
    OMP_NUM_THREADS=1 "$py" "$root/scripts/bench/scaling/ddp_torch.py" "${args[@]}" \
      >"$out/$tag.jsonl" 2>"$out/$tag.log" ||
      { echo "$me: $tag failed:" >&2; tail -5 "$out/$tag.log" >&2; exit 1; }
    return
  fi
  local pids=() side rank
  for side in a b; do
    rank=$([[ $side == a ]] && echo 0 || echo 1)
    RANK=$rank WORLD_SIZE=2 MASTER_ADDR=$subnet.1 MASTER_PORT=$((port + 1)) OMP_NUM_THREADS=1 \
      GLOO_SOCKET_IFNAME=veth-$side "$netem/exec.sh" "$side" --prefix "$prefix" -- \
      "$py" "$root/scripts/bench/scaling/ddp_torch.py" "${args[@]}" \
      >"$out/$tag.rank$rank.jsonl" 2>"$out/$tag.rank$rank.log" &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  ((failed == 0)) || { echo "$me: $tag failed:" >&2; tail -5 "$out/$tag".rank*.log >&2; exit 1; }
  mv "$out/$tag.rank0.jsonl" "$out/$tag.jsonl"
}

for round in $(seq 1 "$rounds"); do
  for model in "${model_list[@]}"; do
    run_single "$model" "$round"
    ((alone)) && run_alone_pair "$model" "$round"
    ((torch)) && run_torch "$model" single "$round"
  done
  for rate in "${rate_list[@]}"; do
    "$netem/up.sh" --rate "$rate" --prefix "$prefix" --subnet "$subnet" --replace >&2
    for model in "${model_list[@]}"; do
      # Each round starts one codec further on, so that no codec always runs first or last.
      for ((c = 0; c < ${#codec_list[@]}; c++)); do
        codec=${codec_list[$(((c + round - 1) % ${#codec_list[@]}))]}
        for transport in "${transport_list[@]}"; do
          for overlap in "${overlap_list[@]}"; do
            run_pair "$model" "$rate" "$overlap" "$round" "$codec" "$transport"
          done
        done
      done
      ((torch)) && run_torch "$model" "$rate" "$round"
    done
  done
  "$netem/down.sh" --prefix "$prefix"
done
bench_load after "$out/info.txt"

measured_spec=""
for m in "${model_list[@]}"; do measured_spec+="${measured_spec:+,}$m=$(measured_from "$m")"; done
"$py" "$root/scripts/bench/scaling/summarize.py" "$out" --warmup "$measured_spec" \
  --batch "$batch_spec" | tee "$out/summary.md"
echo "$me: raw metrics and summary in $out" >&2
