// libsymm's PyTorch extension: memory history and snapshots
// (torch.cuda.memory._record_memory_history and _snapshot). libsymm's pool
// keeps the trace and each entry's annotation (user metadata, compile
// context, which SymmAllocator hands it); SymmAllocator keeps the Python and
// C++ stacks PyTorch's recorder gives for each allocation, free and
// emptyCache, and a snapshot joins the two.
// Part of _torch_ext.cpp's one translation unit, included after
// SymmAllocator's definition.
#ifndef SYMM_TORCH_EXT_SNAPSHOT_H
#define SYMM_TORCH_EXT_SNAPSHOT_H

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <tuple>

#include "_torch_ext_api.h"

namespace {

// Stacks recorded for the trace, by (device, action: 0 alloc or 1 free,
// address), oldest first.
using Stacks = std::map<std::tuple<int, int, uint64_t>, std::vector<std::shared_ptr<c10::GatheredContext>>>;
using LiveStacks = std::unordered_map<void *, std::shared_ptr<c10::GatheredContext>>;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// libsymm's snapshot as listings (symm_pool_snapshot_list): segments, each
// followed in blocks by its blocks, and (with traces) every device's
// history, device by device.
struct Listing {
  std::vector<symm_segment_info_t> segs;
  std::vector<symm_block_info_t> blocks;
  std::vector<symm_trace_entry_t> traces;
  int devices = 0;
};

// snapshot_list takes the listing in arrays sized by a size query, with
// room to spare, and grown again if the pool grew in between.
Listing snapshot_list(bool with_traces) {
  auto list = SYMM_NEED(snapshot_list);
  Listing l;
  l.devices = SYMM_NEED(device_count)();
  check(l.devices < 0 ? g_api.last_error_code() : SYMM_OK, "snapshot: device count");
  int ns = 0, nb = 0, nt = 0;
  check(list(nullptr, &ns, nullptr, &nb, nullptr, with_traces ? &nt : nullptr), "snapshot");
  for (int tries = 0;; tries++) {
    l.segs.resize(static_cast<size_t>(ns) + 16);
    l.blocks.resize(static_cast<size_t>(nb) + 64);
    l.traces.resize(static_cast<size_t>(nt) + 64);
    ns = static_cast<int>(l.segs.size());
    nb = static_cast<int>(l.blocks.size());
    nt = static_cast<int>(l.traces.size());
    int rc = list(l.segs.data(), &ns, l.blocks.data(), &nb, l.traces.data(), with_traces ? &nt : nullptr);
    if (rc == SYMM_OK) break;
    bool grew = rc == SYMM_ERR_INVALID && (ns > static_cast<int>(l.segs.size()) || nb > static_cast<int>(l.blocks.size()) ||
                                           nt > static_cast<int>(l.traces.size()));
    if (!grew || tries == 8) check(rc, "snapshot");
  }
  l.segs.resize(static_cast<size_t>(ns));
  l.blocks.resize(static_cast<size_t>(nb));
  l.traces.resize(with_traces ? static_cast<size_t>(nt) : 0);
  return l;
}

// The segments of libsymm's listing l, in PyTorch's form (only mempool_id's
// unless it is {0, 0}); an allocated block has the stack recorded when it
// was allocated, if live has it.
void add_segments(const Listing &l, MempoolId_t mempool_id, const LiveStacks &live, CCA::SnapshotInfo &out) {
  bool filter = mempool_id != MempoolId_t{0, 0};
  size_t next = 0;  // the first block of the segment
  for (const auto &sg : l.segs) {
    size_t first = next;
    next += static_cast<size_t>(sg.nblocks);
    MempoolId_t owner{sg.pool_id.first, sg.pool_id.second};
    if (filter && owner != mempool_id) continue;
    c10::CachingDeviceAllocator::SegmentInfo si;
    si.owner_private_pool_id = owner;
    si.device = static_cast<c10::DeviceIndex>(sg.device);
    si.address = sg.address;
    si.total_size = sg.total_size;
    si.requested_size = sg.requested_size;
    si.allocated_size = sg.allocated_size;
    si.active_size = sg.active_size;
    si.stream = reinterpret_cast<void *>(sg.stream);
    si.is_large = sg.is_large != 0;
    si.is_expandable = sg.is_expandable != 0;
    for (size_t i = first; i < next && i < l.blocks.size(); i++) {
      const symm_block_info_t &bk = l.blocks[i];
      c10::CachingDeviceAllocator::BlockInfo bi;
      bi.size = bk.size;
      bi.requested_size = bk.requested_size;
      bi.allocated = bk.state == SYMM_BLOCK_ALLOCATED;
      bi.active = bk.state != SYMM_BLOCK_FREE;
      if (bi.allocated) {
        auto it = live.find(reinterpret_cast<void *>(bk.address));
        if (it != live.end()) bi.context_when_allocated = it->second;
      }
      si.blocks.push_back(std::move(bi));
    }
    out.segments.push_back(std::move(si));
  }
}

// PyTorch's name of a SYMM_TRACE_* action ("" for none).
const char *trace_action_name(int32_t a) {
  static const char *const names[] = {"alloc",        "free_requested", "free_completed", "segment_alloc", "segment_free",
                                      "oom",          "snapshot",       "segment_map",    "segment_unmap"};
  return a >= 0 && a < static_cast<int32_t>(sizeof names / sizeof names[0]) ? names[a] : "";
}

// e as PyTorch's TraceEntry, of device dev, without a stack, with the
// annotation libsymm recorded (an older libsymm.so has none: "N/A" and "").
TraceEntry trace_entry(const symm_trace_entry_t &e, TraceEntry::Action a, MempoolId_t pool) {
  TraceEntry t(a, static_cast<c10::DeviceIndex>(e.device), e.address, e.size, reinterpret_cast<void *>(e.stream), pool, 0);
  t.time_.t_ = static_cast<time_t>(e.time_us);
  bool annotated = g_api.set_annotation != nullptr;  // its symm_trace_entry_t has the two fields
  t.compile_context_ = annotated && e.compile_context != nullptr ? e.compile_context : "N/A";
  t.user_metadata_ = annotated && e.user_metadata != nullptr ? e.user_metadata : "";
  return t;
}

// Spans of segment-freeing calls (emptyCache with context "all").
using FreeSpans = std::vector<std::pair<std::pair<int64_t, int64_t>, std::shared_ptr<c10::GatheredContext>>>;

// The trace of each device in libsymm's listing l, in PyTorch's form, less
// the actions in skip, with the stacks PyTorch's record_trace gives each
// entry (none unless recorded with context "alloc" or "all"):
//  - alloc: the allocation's. libsymm's ring and SymmAllocator's records
//    list the allocations and frees of each address in the same order (a
//    record for each, with a stack or none), so the newest k events of an
//    address in the ring take the newest k records of it (older ones may
//    have left either ring); they are moved out of stacks.
//  - free_requested: the free's ("all"), else the block's allocation's
//    ("alloc"); free_completed: the same as its free_requested.
//  - segment_alloc, segment_map: the allocation that took the memory (the
//    next alloc on the device inside the range), as PyTorch gives them the
//    context of the malloc that asked for it.
//  - segment_free, segment_unmap: the emptyCache call's ("all": the spans),
//    else the stack of the segment's allocation (PyTorch's
//    context_when_segment_allocated).
void add_device_traces(const Listing &l, const std::unordered_set<std::string> &skip, Stacks &stacks,
                       const FreeSpans &spans, CCA::SnapshotInfo &out) {
  using Ctx = std::shared_ptr<c10::GatheredContext>;
  out.device_traces.resize(static_cast<size_t>(std::max(l.devices, 0)));
  for (const auto &e : l.traces) {
    std::string action = trace_action_name(e.action);
    if (action.empty() || e.device < 0 || e.device >= l.devices || skip.count(action)) continue;
    out.device_traces[static_cast<size_t>(e.device)].push_back(
        trace_entry(e, c10::CachingDeviceAllocator::parseTraceEntryAction(action), MempoolId_t{0, 0}));
  }
  for (int dev = 0; dev < l.devices; dev++) {
    auto &entries = out.device_traces[static_cast<size_t>(dev)];
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      int kind = it->action_ == TraceEntry::ALLOC ? 0 : it->action_ == TraceEntry::FREE_REQUESTED ? 1 : -1;
      if (kind < 0) continue;
      auto s = stacks.find({dev, kind, it->addr_});
      if (s == stacks.end() || s->second.empty()) continue;
      it->context_ = std::move(s->second.back());
      s->second.pop_back();
    }
    std::unordered_map<size_t, Ctx> alloc_ctx, free_ctx;  // by block address
    std::map<size_t, std::pair<size_t, Ctx>> seg_ctx;     // segment (or run) start: end, its allocation's stack
    std::vector<TraceEntry *> pending;                    // segment allocs waiting for their alloc
    for (auto &t : entries) {
      switch (t.action_) {
        case TraceEntry::ALLOC:
          alloc_ctx[t.addr_] = t.context_;
          for (auto p = pending.begin(); p != pending.end();) {
            if (t.addr_ >= (*p)->addr_ && t.addr_ < (*p)->addr_ + (*p)->size_) {
              (*p)->context_ = t.context_;
              seg_ctx[(*p)->addr_] = {(*p)->addr_ + (*p)->size_, t.context_};
              p = pending.erase(p);
            } else {
              ++p;
            }
          }
          break;
        case TraceEntry::FREE_REQUESTED:
          if (!t.context_) {
            auto a = alloc_ctx.find(t.addr_);
            if (a != alloc_ctx.end()) t.context_ = a->second;
          }
          free_ctx[t.addr_] = t.context_;
          break;
        case TraceEntry::FREE_COMPLETED: {
          auto f = free_ctx.find(t.addr_);
          if (f != free_ctx.end()) t.context_ = f->second;
          break;
        }
        case TraceEntry::SEGMENT_ALLOC:
        case TraceEntry::SEGMENT_MAP:
          pending.push_back(&t);
          break;
        case TraceEntry::SEGMENT_FREE:
        case TraceEntry::SEGMENT_UNMAP: {
          auto at = static_cast<int64_t>(t.time_.t_);
          for (const auto &sp : spans)
            if (at >= sp.first.first && at <= sp.first.second) t.context_ = sp.second;
          if (!t.context_) {
            auto s = seg_ctx.upper_bound(t.addr_);
            if (s != seg_ctx.begin() && t.addr_ < (--s)->second.first) t.context_ = s->second.second;
          }
          break;
        }
        default:
          break;
      }
    }
  }
}

// The allocator settings of libsymm's pool, where PyTorch reports its own.
// Every field is set: PyTorch's struct has no initializers, and its pickler
// (torch::cuda::_memory_snapshot_pickled) writes a bool that is neither 0
// nor 1 as a byte that is no pickle opcode.
void add_settings(CCA::SnapshotInfo &out) {
  symm_pool_settings_t st{};
  check(SYMM_NEED(settings)(&st), "snapshot: settings");
  auto &cm = out.config_metadata;
  cm = {};  // fields this torch has that are set nowhere below read as 0 and false
  cm.expandable_segments = st.expandable_segments != 0;
  // No max_split_size is SIZE_MAX in PyTorch's (-1 once pickled).
  cm.max_split_size = st.max_split_size != 0 ? st.max_split_size : std::numeric_limits<size_t>::max();
  cm.garbage_collection_threshold = st.garbage_collection_threshold;
  cm.last_allocator_settings = st.alloc_conf != nullptr ? st.alloc_conf : "";
  // Pinned host memory and the rounding table are PyTorch's own settings,
  // parsed by PyTorch from the same text (libsymm reads the rounding too).
  using CUDAConfig = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
  cm.pinned_num_register_threads = CUDAConfig::pinned_num_register_threads();
  cm.pinned_use_host_register = CUDAConfig::pinned_use_cuda_host_register();
  cm.release_lock_on_malloc = CUDAConfig::release_lock_on_cudamalloc();
  cm.roundup_power2_divisions = c10::CachingAllocator::AcceleratorAllocatorConfig::roundup_power2_divisions();
}

// ---- allocator trace trackers ------------------------------------------------
// PyTorch calls its trackers from record_trace with every trace event;
// ProcessGroupNCCL (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1)
// attaches two that register each SEGMENT_ALLOC with NCCL and deregister
// each SEGMENT_FREE. libsymm tells the extension of its segment events
// (segment_alloc, segment_free, segment_map, segment_unmap: one per
// segment, or per run of expandable chunks, as PyTorch records them)
// through symm_pool_set_segment_hook, registered when the first tracker is
// attached (until then no event is even queued). The trackers see those
// events, not every alloc and free: the front cache serves those in C and
// nobody tracks them today. libsymm calls the hook outside its pool locks,
// before the call that caused the events returns; a free or unmap is seen
// after the memory went back to the driver (PyTorch: just before), which
// NCCL's deregistration, dropping its own records, does not mind.
void SymmAllocator::attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) {
  bool first;
  {
    std::lock_guard<std::mutex> g(mu_);
    first = trace_trackers_.empty();
    trace_trackers_.push_back(std::move(tracker));
  }
  if (!first) return;
  if (g_api.set_segment_hook == nullptr) {
    TORCH_WARN_ONCE("libsymm: this libsymm.so has no symm_pool_set_segment_hook: allocator trace trackers see nothing");
    return;
  }
  check(g_api.set_segment_hook(&SymmAllocator::on_segment_events, this), "attachAllocatorTraceTracker");
}

// on_segment_events is libsymm's segment hook: each event as PyTorch's
// TraceEntry, to every tracker, outside mu_. Called from libsymm (a Go
// frame below): nothing may throw out of it.
void SymmAllocator::on_segment_events(const symm_trace_entry_t *ev, int n, void *ctx) noexcept {
  auto *self = static_cast<SymmAllocator *>(ctx);
  try {
    std::vector<CCA::AllocatorTraceTracker> trackers;
    {
      std::lock_guard<std::mutex> g(self->mu_);
      trackers = self->trace_trackers_;
    }
    for (int i = 0; i < n; i++) {
      const char *name = trace_action_name(ev[i].action);
      if (*name == '\0') continue;
      TraceEntry te = trace_entry(ev[i], c10::CachingDeviceAllocator::parseTraceEntryAction(name),
                                  MempoolId_t{ev[i].pool_id.first, ev[i].pool_id.second});
      for (auto &t : trackers) t(te);
    }
  } catch (const std::exception &e) {
    fprintf(stderr, "libsymm: an allocator trace tracker failed: %s\n", e.what());
  } catch (...) {
    fprintf(stderr, "libsymm: an allocator trace tracker failed\n");
  }
}

// ---- memory history and snapshots ---------------------------------------------
bool SymmAllocator::isHistoryEnabled() { return history_.load(); }

// As PyTorch's recordHistory: off, or clear_history, empties the trace
// (libsymm's ring: off empties it, so a clear while on is off then on) and
// the stacks kept for it, so that what a program recorded before does not
// reach the next round's snapshot.
void SymmAllocator::recordHistory(bool enabled, CCA::CreateContextFn recorder, size_t max_entries,
                                  CCA::RecordContext when, bool clear_history, const std::vector<std::string> &skip_actions) {
  if (enabled && max_entries == 0) max_entries = 1;
  // libsymm's ring keeps at most 2^31 entries per device; PyTorch's default
  // is sys.maxsize.
  if (enabled && clear_history) check(g_api.record_history(0, 0), "_record_memory_history");
  check(g_api.record_history(enabled ? 1 : 0, enabled ? max_entries : 0), "_record_memory_history");
  std::lock_guard<std::mutex> g(mu_);
  history_.store(enabled);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : CCA::RecordContext::NEVER;
  max_ctx_ = std::min<size_t>(max_entries, kMaxContexts);
  skip_ = std::unordered_set<std::string>(skip_actions.begin(), skip_actions.end());
  if (!enabled || clear_history) {
    trace_ctx_.clear();
    free_spans_.clear();
  }
  if (!enabled) live_ctx_.clear();  // stacks of live blocks go with the history
  while (trace_ctx_.size() > max_ctx_) trace_ctx_.pop_front();
  // While history is on every alloc and free is remembered, with a stack or
  // without, so that the records match libsymm's ring one for one.
  recording_.store(enabled);
}

CCA::SnapshotInfo SymmAllocator::snapshot(MempoolId_t mempool_id, bool include_traces) {
  // No GIL, no Python: plain structs from libsymm, joined with the stacks.
  Listing l = snapshot_list(include_traces);
  CCA::SnapshotInfo out;
  LiveStacks live;
  std::vector<CtxRecord> traced;
  FreeSpans spans;
  std::unordered_set<std::string> skip;
  {
    std::lock_guard<std::mutex> g(mu_);
    live = live_ctx_;
    traced.assign(trace_ctx_.begin(), trace_ctx_.end());
    for (const auto &sp : free_spans_) spans.push_back({{sp.t0, sp.t1}, sp.ctx});
    skip = skip_;
  }
  add_segments(l, mempool_id, live, out);
  Stacks stacks;
  for (auto &r : traced) stacks[{r.device, r.action, r.addr}].push_back(r.ctx);
  if (include_traces) add_device_traces(l, skip, stacks, spans, out);
  add_settings(out);
  return out;
}

// The stack PyTorch's record_trace keeps for an entry: with context "alloc"
// or "all" only (RecordContext::STATE keeps stacks for live blocks alone).
static bool traced_stacks(CCA::RecordContext when) {
  return when == CCA::RecordContext::ALLOC || when == CCA::RecordContext::ALL;
}

void SymmAllocator::remember_alloc(void *p, int dev) {
  CCA::CreateContextFn rec;
  CCA::RecordContext when;
  {
    std::lock_guard<std::mutex> g(mu_);
    rec = recorder_;
    when = when_;
  }
  std::shared_ptr<c10::GatheredContext> ctx;
  if (rec != nullptr && when != CCA::RecordContext::NEVER) ctx = rec();  // outside mu_ (it may take the GIL)
  std::lock_guard<std::mutex> g(mu_);
  if (!history_.load()) return;  // turned off meanwhile: nothing to match
  if (ctx) live_ctx_[p] = ctx;
  push_ctx({dev, 0, (uint64_t)p, traced_stacks(when) ? ctx : nullptr});
}

// device_of is the device of p's memory (history records of a
// raw_delete, which has no device); -1 if CUDA cannot say.
int SymmAllocator::device_of(void *p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return a.device;
}

void SymmAllocator::remember_free(void *p, int dev) {
  CCA::CreateContextFn rec;
  CCA::RecordContext when;
  {
    std::lock_guard<std::mutex> g(mu_);
    live_ctx_.erase(p);
    rec = recorder_;
    when = when_;
  }
  std::shared_ptr<c10::GatheredContext> ctx;
  if (rec != nullptr && when == CCA::RecordContext::ALL) ctx = rec();
  std::lock_guard<std::mutex> g(mu_);
  if (!history_.load()) return;
  push_ctx({dev, 1, (uint64_t)p, ctx});
}

void SymmAllocator::push_ctx(CtxRecord r) {  // with mu_ held
  trace_ctx_.push_back(std::move(r));
  while (trace_ctx_.size() > max_ctx_) trace_ctx_.pop_front();
}

SymmAllocator::FreeSpan SymmAllocator::begin_free_span() {
  CCA::CreateContextFn rec;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!history_.load() || when_ != CCA::RecordContext::ALL) return {};
    rec = recorder_;
  }
  FreeSpan s;
  if (rec != nullptr) s.ctx = rec();
  s.t0 = now_us();
  return s;
}

void SymmAllocator::end_free_span(FreeSpan span) {
  if (!span.ctx) return;
  span.t1 = now_us();
  std::lock_guard<std::mutex> g(mu_);
  if (!history_.load()) return;
  free_spans_.push_back(std::move(span));
  while (free_spans_.size() > kMaxFreeSpans) free_spans_.pop_front();
}

// ---- annotations: user metadata and compile context ---------------------------
// PyTorch keeps both per thread (thread_local in its device allocator) and
// records them in every trace entry. Here each thread keeps its own, for
// getUserMetadata, and hands libsymm the pair whenever it changes: libsymm
// records the one set last by any thread (include/symm.h).
struct ThreadAnnotation {
  std::string metadata;
  std::vector<std::string> compile;  // the compile-context stack; top last
};

static ThreadAnnotation &thread_annotation() {
  thread_local ThreadAnnotation a;
  return a;
}

void SymmAllocator::send_annotation() {
  if (g_api.set_annotation == nullptr) {
    TORCH_WARN_ONCE("libsymm: this libsymm.so has no symm_pool_set_annotation: memory history has no user metadata "
                    "or compile context");
    return;
  }
  const ThreadAnnotation &a = thread_annotation();
  check(g_api.set_annotation(a.metadata.c_str(), a.compile.empty() ? "" : a.compile.back().c_str()),
        "memory history annotation");
}

// As PyTorch's: compile regions are tracked only while history is on.
void SymmAllocator::pushCompileContext(std::string &md) {
  if (!history_.load()) return;
  thread_annotation().compile.push_back(md);
  send_annotation();
}

void SymmAllocator::popCompileContext() {
  if (!history_.load()) return;
  auto &c = thread_annotation().compile;
  if (c.empty()) return;
  c.pop_back();
  send_annotation();
}

void SymmAllocator::setUserMetadata(const std::string &metadata) {
  thread_annotation().metadata = metadata;
  send_annotation();
}

std::string SymmAllocator::getUserMetadata() { return thread_annotation().metadata; }

}  // namespace

#endif  // SYMM_TORCH_EXT_SNAPSHOT_H
