#!/usr/bin/env bash
# The header is the contract: every symm_* symbol the library exports is
# declared in the header, every declared function is exported, and no
# multicast entry point is referenced (DESIGN.md: multicast is never used).
set -euo pipefail
lib=${1:?library}; hdr=${2:?header}
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -E '^symm_' | sort -u)
declared=$(grep -oE '\bsymm_[a-z0-9_]+[[:space:]]*\(' "$hdr" | tr -d '( \t' | sort -u)
rc=0
if extra=$(comm -23 <(echo "$exported") <(echo "$declared")) && [ -n "$extra" ]; then
  echo "exported but not declared in $hdr:"; echo "$extra"; rc=1
fi
if missing=$(comm -13 <(echo "$exported") <(echo "$declared")) && [ -n "$missing" ]; then
  echo "declared in $hdr but not exported by $lib:"; echo "$missing"; rc=1
fi
if other=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -vE '^symm_') && [ -n "$other" ]; then
  echo "exported symbols outside the symm_ ABI:"; echo "$other"; rc=1
fi
if grep -aqiE 'cuMulticast|ncclGetLsaMultimemDevicePointer|nvshmemx_mc_ptr' "$lib"; then
  echo "$lib references a multicast entry point"; rc=1
fi
[ $rc = 0 ] && echo "check_abi: $(echo "$exported" | wc -l) symbols exported = declared; no multicast reference"
exit $rc
