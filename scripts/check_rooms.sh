#!/usr/bin/env bash
# Checks that engine/'s rooms include one way (docs/ARCHITECTURE.md draws them): every source
# file of engine/ lives in a room, a room's files include only their own room and the rooms
# below it, and distributed/ includes nothing of engine/. Lists every include that breaks the
# rule, with its file and line.
#   scripts/check_rooms.sh [TREE]     TREE: the source tree to check (default: this repository)
set -euo pipefail
tree=${1:-"$(dirname "$0")/.."}
cd "$tree"
[[ -d engine ]] || { echo "check_rooms.sh: no engine/ in $tree" >&2; exit 1; }

# Each room and the rooms below it, which its files may include (besides their own).
declare -A below=(
  [base]=""
  [tensor]="base"
  [cuda]="base tensor"
  [io]="base tensor"
  [graph]="base tensor io"
  [parallel]="base tensor io graph"
)
rooms="base tensor cuda io graph parallel"

bad=()
checked=0
while IFS= read -r -d '' file; do
  checked=$((checked + 1))
  if [[ $file == distributed/* ]]; then
    room="" may=""
  else
    rel=${file#engine/}
    room=${rel%%/*}
    if [[ $rel != */* ]]; then
      bad+=("$file: not in a room (engine/ROOM/, ROOM one of: $rooms)")
      continue
    fi
    if [[ -z ${below[$room]+set} ]]; then
      bad+=("$file: engine/$room/ is not a room (rooms: $rooms; a new one goes in scripts/check_rooms.sh and docs/ARCHITECTURE.md)")
      continue
    fi
    may="$room${below[$room]:+ ${below[$room]}}"
  fi
  # grep -n prints LINE:#include "engine/ROOM/NAME" (or engine/NAME, which is in no room).
  while IFS=: read -r line text; do
    target=${text#*[\"<]}
    target=${target%%[\">]*}
    rest=${target#engine/}
    if [[ -z $room ]]; then
      bad+=("$file:$line: includes $target: distributed/ stands alone and includes nothing of engine/")
    elif [[ $rest != */* ]]; then
      bad+=("$file:$line: includes $target, which is in no room")
    elif [[ " $may " != *" ${rest%%/*} "* ]]; then
      bad+=("$file:$line: includes $target: room $room may include only: $may")
    fi
  done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]engine/' "$file" || true)
done < <(find engine distributed -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' \
  -o -name '*.cuh' \) -print0 2>/dev/null | sort -z)

if ((${#bad[@]})); then
  echo "check_rooms.sh: ${#bad[@]} include(s) or file(s) break the rooms' one-way rule (docs/ARCHITECTURE.md):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_rooms.sh: $checked files of engine/ and distributed/ include one way"
