// libsymm's PyTorch extension: memory history and snapshots
// (torch.cuda.memory._record_memory_history and _snapshot). libsymm's pool
// keeps the trace; SymmAllocator keeps the Python and C++ stacks PyTorch's
// recorder gives for each allocation and free, and a snapshot joins the two.
// Part of _torch_ext.cpp's one translation unit, included after
// SymmAllocator's definition.
#ifndef SYMM_TORCH_EXT_SNAPSHOT_H
#define SYMM_TORCH_EXT_SNAPSHOT_H

#include <chrono>
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

// libsymm's snapshot (symm_pool_snapshot) as JSON, in a buffer grown until
// it fits.
std::string snapshot_json() {
  std::string json;
  for (size_t cap = 1 << 16;;) {
    json.resize(cap);
    size_t len = 0;
    int rc = g_api.snapshot(&json[0], cap, &len);
    if (rc == SYMM_OK) {
      json.resize(len);
      break;
    }
    TORCH_CHECK(rc == SYMM_ERR_INVALID && len + 1 > cap, "libsymm: snapshot: ", last_error());
    cap = len + 4096;
  }
  return json;
}

// The segments of libsymm's snapshot d, in PyTorch's form (only mempool_id's
// unless it is {0, 0}); an allocated block has the stack recorded when it
// was allocated, if live has it.
void add_segments(const py::dict &d, MempoolId_t mempool_id, const LiveStacks &live, CCA::SnapshotInfo &out) {
  bool filter = mempool_id != MempoolId_t{0, 0};
  for (auto seg : d["segments"].cast<py::list>()) {
    py::dict sd = seg.cast<py::dict>();
    c10::CachingDeviceAllocator::SegmentInfo si;
    py::list pid = sd["segment_pool_id"].cast<py::list>();
    si.owner_private_pool_id = {pid[0].cast<unsigned long long>(), pid[1].cast<unsigned long long>()};
    if (filter && si.owner_private_pool_id != mempool_id) continue;
    si.device = static_cast<c10::DeviceIndex>(sd["device"].cast<int>());
    si.address = sd["address"].cast<size_t>();
    si.total_size = sd["total_size"].cast<size_t>();
    si.requested_size = sd["requested_size"].cast<size_t>();
    si.allocated_size = sd["allocated_size"].cast<size_t>();
    si.active_size = sd["active_size"].cast<size_t>();
    si.stream = reinterpret_cast<void *>(sd["stream"].cast<uint64_t>());
    si.is_large = sd["segment_type"].cast<std::string>() == "large";
    si.is_expandable = sd["is_expandable"].cast<bool>();
    for (auto blk : sd["blocks"].cast<py::list>()) {
      py::dict bd = blk.cast<py::dict>();
      c10::CachingDeviceAllocator::BlockInfo bi;
      bi.size = bd["size"].cast<size_t>();
      bi.requested_size = bd["requested_size"].cast<size_t>();
      std::string state = bd["state"].cast<std::string>();
      bi.allocated = state == "active_allocated";
      bi.active = state != "inactive";
      if (bi.allocated) {
        auto it = live.find(reinterpret_cast<void *>(bd["address"].cast<uint64_t>()));
        if (it != live.end()) bi.context_when_allocated = it->second;
      }
      si.blocks.push_back(std::move(bi));
    }
    out.segments.push_back(std::move(si));
  }
}

// The trace of each device in libsymm's snapshot d, in PyTorch's form, less
// the actions in skip and the entries before cleared_at (µs). Stacks of the
// trace: libsymm's ring and SymmAllocator's records list the same
// allocations and frees of each address in the same order, so the newest k
// events of an address in the ring take the newest k stacks recorded for it
// (older ones may have left either ring); they are moved out of stacks.
void add_device_traces(const py::dict &d, const std::unordered_set<std::string> &skip, int64_t cleared_at,
                       Stacks &stacks, CCA::SnapshotInfo &out) {
  int dev = 0;
  for (auto devtrace : d["device_traces"].cast<py::list>()) {
    std::vector<TraceEntry> entries;
    for (auto e : devtrace.cast<py::list>()) {
      py::dict ed = e.cast<py::dict>();
      std::string action = ed["action"].cast<std::string>();
      if (skip.count(action)) continue;
      int64_t t = ed["time_us"].cast<int64_t>();
      if (t < cleared_at) continue;
      TraceEntry::Action a = c10::CachingDeviceAllocator::parseTraceEntryAction(action);
      size_t addr = ed[a == TraceEntry::OOM ? "device_free" : "addr"].cast<size_t>();
      entries.emplace_back(a, static_cast<c10::DeviceIndex>(dev), addr, ed["size"].cast<size_t>(),
                           reinterpret_cast<void *>(ed["stream"].cast<uint64_t>()), MempoolId_t{0, 0}, 0);
      entries.back().time_.t_ = static_cast<time_t>(t);
      if (ed.contains("compile_context")) entries.back().compile_context_ = ed["compile_context"].cast<std::string>();
      if (ed.contains("user_metadata")) entries.back().user_metadata_ = ed["user_metadata"].cast<std::string>();
    }
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      int kind = it->action_ == TraceEntry::ALLOC ? 0 : it->action_ == TraceEntry::FREE_REQUESTED ? 1 : -1;
      if (kind < 0) continue;
      auto s = stacks.find({dev, kind, it->addr_});
      if (s == stacks.end() || s->second.empty()) continue;
      it->context_ = std::move(s->second.back());
      s->second.pop_back();
    }
    out.device_traces.push_back(std::move(entries));
    dev++;
  }
}

// The allocator settings in libsymm's snapshot d, where PyTorch reports its own.
void add_settings(const py::dict &d, CCA::SnapshotInfo &out) {
  if (d.contains("allocator_settings")) {
    py::dict as = d["allocator_settings"].cast<py::dict>();
    auto &cm = out.config_metadata;
    if (as.contains("expandable_segments")) cm.expandable_segments = as["expandable_segments"].cast<bool>();
    if (as.contains("max_split_size")) cm.max_split_size = as["max_split_size"].cast<size_t>();
    if (as.contains("garbage_collection_threshold"))
      cm.garbage_collection_threshold = as["garbage_collection_threshold"].cast<double>();
    if (as.contains("PYTORCH_CUDA_ALLOC_CONF"))
      cm.last_allocator_settings = as["PYTORCH_CUDA_ALLOC_CONF"].cast<std::string>();
  }
}

void SymmAllocator::attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) {
  // PyTorch's own tools (the FSDP memory tracker) use it; libsymm's trace
  // is in its snapshots instead. Keep it so that attaching never fails.
  std::lock_guard<std::mutex> g(mu_);
  trace_trackers_.push_back(std::move(tracker));
}

// ---- memory history and snapshots ---------------------------------------------
bool SymmAllocator::isHistoryEnabled() { return history_.load(); }

void SymmAllocator::recordHistory(bool enabled, CCA::CreateContextFn recorder, size_t max_entries,
                                  CCA::RecordContext when, bool clear_history, const std::vector<std::string> &skip_actions) {
  if (enabled && max_entries == 0) max_entries = 1;
  // libsymm's ring keeps at most 2^31 entries per device; PyTorch's default
  // is sys.maxsize.
  check(g_api.record_history(enabled ? 1 : 0, enabled ? max_entries : 0), "_record_memory_history");
  std::lock_guard<std::mutex> g(mu_);
  history_.store(enabled);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : CCA::RecordContext::NEVER;
  max_ctx_ = std::min<size_t>(max_entries, kMaxContexts);
  skip_ = std::unordered_set<std::string>(skip_actions.begin(), skip_actions.end());
  if (clear_history) {
    trace_ctx_.clear();
    cleared_at_us_ = now_us();
  }
  if (!enabled) {
    // PyTorch drops stacks when history goes off; the trace stays.
    live_ctx_.clear();
  }
  recording_.store(enabled && recorder != nullptr && when != CCA::RecordContext::NEVER);
}

CCA::SnapshotInfo SymmAllocator::snapshot(MempoolId_t mempool_id, bool include_traces) {
  std::string json = snapshot_json();
  CCA::SnapshotInfo out;
  py::gil_scoped_acquire gil;
  py::dict d = py::module_::import("json").attr("loads")(json);
  LiveStacks live;
  std::vector<CtxRecord> traced;
  int64_t cleared_at = 0;
  std::unordered_set<std::string> skip;
  {
    std::lock_guard<std::mutex> g(mu_);
    live = live_ctx_;
    traced.assign(trace_ctx_.begin(), trace_ctx_.end());
    cleared_at = cleared_at_us_;
    skip = skip_;
  }
  add_segments(d, mempool_id, live, out);
  Stacks stacks;
  for (auto &r : traced) stacks[{r.device, r.action, r.addr}].push_back(r.ctx);
  if (include_traces) add_device_traces(d, skip, cleared_at, stacks, out);
  add_settings(d, out);
  return out;
}

void SymmAllocator::remember_alloc(void *p, int dev) {
  CCA::CreateContextFn rec;
  CCA::RecordContext when;
  {
    std::lock_guard<std::mutex> g(mu_);
    rec = recorder_;
    when = when_;
  }
  if (rec == nullptr || when == CCA::RecordContext::NEVER) return;
  auto ctx = rec();  // Python and C++ stacks: outside mu_ (it may take the GIL)
  std::lock_guard<std::mutex> g(mu_);
  live_ctx_[p] = ctx;
  if (when == CCA::RecordContext::ALLOC || when == CCA::RecordContext::ALL) push_ctx({dev, 0, (uint64_t)p, ctx});
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
  if (rec == nullptr || when != CCA::RecordContext::ALL) return;
  auto ctx = rec();
  std::lock_guard<std::mutex> g(mu_);
  push_ctx({dev, 1, (uint64_t)p, ctx});
}

void SymmAllocator::push_ctx(CtxRecord r) {  // with mu_ held
  trace_ctx_.push_back(std::move(r));
  while (trace_ctx_.size() > max_ctx_) trace_ctx_.pop_front();
}

}  // namespace

#endif  // SYMM_TORCH_EXT_SNAPSHOT_H
