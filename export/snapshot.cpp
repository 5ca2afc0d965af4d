// Snapshots as C listings, the pool's settings and the segment hook (the
// section "snapshots as C listings, segment events" of include/symm.h):
// wrappers that check the fork flag and the pointers and call the Go
// exports of snapshot.go and seghook.go; and the hook itself, stored here
// and called from Go (seghook.go says when).
#include <atomic>
#include <mutex>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "shim.h"
#include "shim_internal.h"

using namespace symmshim;

namespace {

std::mutex g_hook_mu;  // guards the pair below; never held while the hook runs
symm_segment_hook_fn g_hook = nullptr;
void *g_hook_ctx = nullptr;
thread_local bool t_in_hook = false;

}  // namespace

extern "C" {

int symm_pool_snapshot_list(symm_segment_info_t *segs, int *nsegs, symm_block_info_t *blocks, int *nblocks,
                            symm_trace_entry_t *traces, int *ntraces) {
  if (forked("symm_pool_snapshot_list")) return SYMM_ERR_FORKED;
  const char *bad = nullptr;
  if (nsegs == nullptr || nblocks == nullptr)
    bad = "symm_pool_snapshot_list: nsegs or nblocks is NULL";
  else if (*nsegs < 0 || *nblocks < 0 || (ntraces != nullptr && *ntraces < 0))
    bad = "symm_pool_snapshot_list: a capacity (*nsegs, *nblocks, *ntraces) is negative";
  else if ((*nsegs > 0 && segs == nullptr) || (*nblocks > 0 && blocks == nullptr) ||
           (ntraces != nullptr && *ntraces > 0 && traces == nullptr))
    bad = "symm_pool_snapshot_list: segs, blocks or traces is NULL with a capacity above 0";
  if (bad != nullptr) {
    if (nsegs != nullptr) *nsegs = 0;
    if (nblocks != nullptr) *nblocks = 0;
    if (ntraces != nullptr) *ntraces = 0;
    return fail(SYMM_ERR_INVALID, bad);
  }
  return goPoolSnapshotList(segs, nsegs, blocks, nblocks, traces, ntraces);
}

int symm_pool_set_annotation(const char *user_metadata, const char *compile_context) {
  if (forked("symm_pool_set_annotation")) return SYMM_ERR_FORKED;
  if (user_metadata == nullptr || compile_context == nullptr)
    return fail(SYMM_ERR_INVALID, "symm_pool_set_annotation: user_metadata or compile_context is NULL");
  return goPoolSetAnnotation(const_cast<char *>(user_metadata), const_cast<char *>(compile_context));
}

int symm_pool_settings(symm_pool_settings_t *out) {
  if (forked("symm_pool_settings")) return SYMM_ERR_FORKED;
  if (out == nullptr) return fail(SYMM_ERR_INVALID, "symm_pool_settings: out is NULL");
  return goPoolSettings(out);
}

int symm_pool_set_segment_hook(symm_segment_hook_fn fn, void *ctx) {
  if (forked("symm_pool_set_segment_hook")) return SYMM_ERR_FORKED;
  // The delivering thread holds seg.mu (seghook.go) while the hook runs.
  if (t_in_hook) return fail(SYMM_ERR_BUSY, "symm_pool_set_segment_hook: called from the segment hook");
  {
    std::lock_guard<std::mutex> g(g_hook_mu);
    g_hook = fn;
    g_hook_ctx = ctx;
  }
  return goPoolWatchSegments(fn != nullptr ? 1 : 0);
}

int symmshim_in_segment_hook(void) { return t_in_hook ? 1 : 0; }

void symmshim_call_segment_hook(const symm_trace_entry_t *events, int n) {
  symm_segment_hook_fn fn;
  void *ctx;
  {
    std::lock_guard<std::mutex> g(g_hook_mu);
    fn = g_hook;
    ctx = g_hook_ctx;
  }
  if (fn == nullptr || n <= 0) return;
  t_in_hook = true;
  fn(events, n, ctx);
  t_in_hook = false;
}

}  // extern "C"
