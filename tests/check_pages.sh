#!/usr/bin/env bash
# check_pages.sh CMD...: runs CMD, then fails if it left statistics pages
# (symm top's, /dev/shm/libsymm-UID-PID-ID) of processes that are gone.
# Every libsymm process publishes one while it lives and removes it when it
# exits; one that is killed cannot, so tests that kill processes give them a
# directory of their own (SYMM_PUBLISH_DIR). The pages of live processes,
# and those there before CMD ran, are not this check's business: it only
# names and removes the new pages of dead processes, as symm top would.
set -uo pipefail
dir=${SYMM_PUBLISH_DIR:-/dev/shm}
prefix="libsymm-$(id -u)-"
pages() { find "$dir" -maxdepth 1 -name "$prefix*" -printf '%f\n' 2>/dev/null | sort; }
# alive PID PAGE: PID runs and is the process that made PAGE. Pids are
# reused over the thousands of processes a test run starts, so a live pid
# is the page's only when its start time (field 22 of /proc/PID/stat, clock
# ticks since boot) is the one the page records (bytes 24-31, little endian,
# publish/page.go; 0: not recorded), as symm top tells them apart.
alive() {
  local stat want fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  want=$(od -An -tu8 -j24 -N8 "$2" 2>/dev/null | tr -d ' ')
  read -r -a fields <<<"${stat##*) }" # from field 3 on: field 22 is [19]
  [[ -z $want || $want == 0 || $want == "${fields[19]}" ]]
}
before=$(pages)
"$@"
rc=$?
left=()
while read -r name; do
  [[ -n $name ]] || continue
  pid=${name#"$prefix"}
  pid=${pid%%-*}
  alive "$pid" "$dir/$name" && continue # it removes its page when it exits
  left+=("$name")
done < <(comm -13 <(echo "$before") <(pages))
if ((${#left[@]} > 0)); then
  echo "check_pages: '$*' left ${#left[@]} statistics page(s) of processes that are gone in $dir (removed now):"
  for name in "${left[@]}"; do
    # The page's command line (256 bytes at offset 80, publish/page.go), to tell which test left it.
    echo "  $name: $(dd if="$dir/$name" bs=1 skip=80 count=256 status=none | tr -d '\0' | tr -c '[:print:]' ' ')"
    rm -f "$dir/$name"
  done
  exit 1
fi
exit "$rc"
