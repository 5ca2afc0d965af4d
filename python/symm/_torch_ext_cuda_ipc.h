// libsymm's PyTorch extension: CUDA IPC for torch.multiprocessing, in
// PyTorch's own handle format (SymmAllocator's shareIpcHandle and
// getIpcDevPtr, and the sharing of expandable segments' chunks by POSIX
// descriptor), and the CUDA driver's VMM calls that sharing needs. Part of
// _torch_ext.cpp's one translation unit, included after SymmAllocator's
// definition. The parsing of a received handle is _torch_ext_ipc.h: pure,
// tested without torch or CUDA.
#ifndef SYMM_TORCH_EXT_CUDA_IPC_H
#define SYMM_TORCH_EXT_CUDA_IPC_H

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "_torch_ext_api.h"
#include "_torch_ext_ipc.h"

namespace {

// ---- the CUDA driver's VMM calls (expandable segments' IPC) -------------------
// Taken from the driver libsymm's pool runs on (symm_driver_proc: libsymm is
// the one loader of libcuda); missing ones make only the expandable-segment
// sharing fail, with a message.
struct Driver {
  CUresult (*retain)(CUmemGenericAllocationHandle *, void *) = nullptr;
  CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*addr_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) = nullptr;
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags) = nullptr;
  std::string missing;
};

const Driver &driver() {
  static const Driver d = [] {
    Driver x;
    auto get = [&](const char *name, auto &fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(g_api.driver_proc(name));
      if (fn == nullptr) x.missing += std::string(x.missing.empty() ? "" : ", ") + name;
    };
    get("cuMemRetainAllocationHandle", x.retain);
    get("cuMemExportToShareableHandle", x.export_fd);
    get("cuMemImportFromShareableHandle", x.import_fd);
    get("cuMemRelease", x.release);
    get("cuMemAddressReserve", x.reserve);
    get("cuMemAddressFree", x.addr_free);
    get("cuMemMap", x.map);
    get("cuMemUnmap", x.unmap);
    get("cuMemSetAccess", x.set_access);
    get("cuMemGetAllocationGranularity", x.granularity);
    return x;
  }();
  TORCH_CHECK(d.missing.empty(), "libsymm: CUDA IPC of expandable segments needs the driver's ", d.missing);
  return d;
}

void drv_check(CUresult r, const char *what) {
  TORCH_CHECK(r == CUDA_SUCCESS, "libsymm: ", what, " failed: CUresult ", static_cast<int>(r));
}

// The chunk size of VMM allocations made for sharing by POSIX descriptor on dev.
size_t vmm_granularity(const Driver &d, int dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  drv_check(d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  return g;
}

// PyTorch's header of a shared expandable segment and its parsing:
// _torch_ext_ipc.h (pure, tested without torch by tests/c/test_torch_ext_ipc.cpp).
using symm_ipc::ShareHeader;
using symm_ipc::kHandleCudaMalloc;
using symm_ipc::kHandleExpandable;
using symm_ipc::kHandleExpandableMixed;
using symm_ipc::kHandleVersion;

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

// ---- CUDA IPC (torch.multiprocessing) -------------------------------------------
//
// PyTorch's own format, so that a libsymm process and a process on
// PyTorch's allocator read each other's tensors: version 2, type 'c', then
// the cudaIpcMemHandle_t of the whole driver allocation (the segment); the
// tensor's offset in it travels beside the handle. An expandable segment's
// chunks go as PyTorch's type 'e' when of one size, else as libsymm's 'm'
// (_torch_ext_ipc.h), which only a libsymm receiver reads.

CCA::ShareableHandle SymmAllocator::shareIpcHandle(void *ptr) {
  uint64_t base = 0, size = 0;
  int expandable = 0;
  check(SYMM_NEED(segment_of)(ptr, &base, &size, &expandable), "shareIpcHandle");
  if (expandable) return share_expandable(ptr, base, size);
  cudaIpcMemHandle_t h;
  C10_CUDA_CHECK(cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(base)));
  std::string s;
  s.push_back(kHandleVersion);
  s.push_back(kHandleCudaMalloc);
  s.append(reinterpret_cast<const char *>(&h), sizeof h);
  return CCA::ShareableHandle{static_cast<ptrdiff_t>(reinterpret_cast<uint64_t>(ptr) - base), s};
}

std::shared_ptr<void> SymmAllocator::getIpcDevPtr(std::string handle) {
  // The bare 64-byte handle is PyTorch's format before handle versions.
  const char *raw = nullptr;
  bool expandable = false;
  if (handle.size() == CUDA_IPC_HANDLE_SIZE) {
    raw = handle.data();
  } else if (handle.size() == 2 + CUDA_IPC_HANDLE_SIZE && handle[0] == kHandleVersion &&
             handle[1] == kHandleCudaMalloc) {
    raw = handle.data() + 2;
  } else if (handle.size() >= 2 + sizeof(ShareHeader) && handle[0] == kHandleVersion &&
             (handle[1] == kHandleExpandable || handle[1] == kHandleExpandableMixed)) {
    expandable = true;
  } else {
    TORCH_CHECK(false, "libsymm: getIpcDevPtr: a CUDA IPC handle of ", handle.size(), " bytes",
                handle.size() >= 2 ? std::string(" (version ") + std::to_string(int(handle[0])) + ", type '" +
                                         handle[1] + "')"
                                   : std::string(),
                " is in no format libsymm knows (version 2, type 'c', 'e' or 'm')");
  }
  std::lock_guard<std::mutex> g(ipc_mu_);
  auto it = ipc_.find(handle);
  if (it != ipc_.end()) {
    if (auto p = it->second.lock()) return p;  // one mapping per handle: CUDA refuses a second open
  }
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  std::shared_ptr<void> sp = expandable ? open_expandable(handle, device) : open_cuda_malloc(handle, raw, device);
  ipc_[handle] = sp;
  return sp;
}

std::shared_ptr<void> SymmAllocator::open_cuda_malloc(const std::string &handle, const char *raw, int device) {
  cudaIpcMemHandle_t h;
  memcpy(&h, raw, sizeof h);
  void *dev = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev, h, cudaIpcMemLazyEnablePeerAccess));
  return std::shared_ptr<void>(dev, [this, handle, device](void *p) {
    forget_ipc(handle);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaError_t e = cudaIpcCloseMemHandle(p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // a destructor: report, never throw
      TORCH_WARN("libsymm: cudaIpcCloseMemHandle: ", cudaGetErrorString(e));
    }
  });
}

void SymmAllocator::forget_ipc(const std::string &handle) {
  std::lock_guard<std::mutex> g(ipc_mu_);
  auto i = ipc_.find(handle);
  if (i != ipc_.end() && i->second.expired()) ipc_.erase(i);
}

// A segment shared as PyTorch's expandable segments are: its chunks'
// descriptors are duplicated from the sender (pidfd_getfd, which needs the
// same user and ptrace permission, as PyTorch's own receiver does),
// imported and mapped into a range of this process, each chunk whole at
// the sum of the sizes before it (all one size in PyTorch's type 'e';
// libsymm's 'm' lists them).
std::shared_ptr<void> SymmAllocator::open_expandable(const std::string &handle, int device) {
  const Driver &d = driver();
  // Counts from another process: checked against the handle's bytes
  // without overflow before anything is read or reserved.
  symm_ipc::Expandable eh;
  std::string bad = handle[1] == kHandleExpandableMixed
                        ? symm_ipc::parse_expandable_mixed(handle.data(), handle.size(), &eh)
                        : symm_ipc::parse_expandable(handle.data(), handle.size(), &eh);
  TORCH_CHECK(bad.empty(), "libsymm: getIpcDevPtr: ", bad);
  const ShareHeader &hd = eh.header;
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, hd.pid, 0));
  TORCH_CHECK(pidfd >= 0, "libsymm: getIpcDevPtr: pidfd_open(", hd.pid, ") of the sending process: ",
              strerror(errno));
  size_t total = eh.total;
  CUdeviceptr va = 0;
  // Default alignment (the granularity): PyTorch's chunks are 20 MiB, not
  // a power of two, which the driver refuses as an alignment.
  CUresult r = d.reserve(&va, total, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    close(pidfd);
    drv_check(r, "cuMemAddressReserve");
  }
  size_t mapped = 0, at = 0;  // chunks mapped, and the offset of the next
  std::string err;
  for (size_t i = 0; i < hd.num_handles && err.empty(); i++) {
    int fd = eh.fds[i];
    // pidfd_getfd's descriptor is close-on-exec.
    int mine = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    if (mine < 0) {
      err = std::string("pidfd_getfd(descriptor ") + std::to_string(fd) + " of process " + std::to_string(hd.pid) +
            "): " + strerror(errno);
      break;
    }
    CUmemGenericAllocationHandle h = 0;
    r = d.import_fd(&h, reinterpret_cast<void *>(static_cast<intptr_t>(mine)),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(mine);
    if (r != CUDA_SUCCESS) {
      err = "cuMemImportFromShareableHandle: CUresult " + std::to_string(static_cast<int>(r));
      break;
    }
    r = d.map(va + at, eh.sizes[i], 0, h, 0);
    d.release(h);  // the mapping holds the memory now
    if (r != CUDA_SUCCESS) {
      err = "cuMemMap of " + std::to_string(eh.sizes[i]) + " bytes: CUresult " + std::to_string(static_cast<int>(r));
      break;
    }
    at += eh.sizes[i];
    mapped++;
  }
  close(pidfd);
  if (err.empty()) {
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = device;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.set_access(va, total, &acc, 1);
    if (r != CUDA_SUCCESS) err = "cuMemSetAccess: CUresult " + std::to_string(static_cast<int>(r));
  }
  auto undo = [&d, va, total, sizes = std::move(eh.sizes)](size_t n) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
      d.unmap(va + off, sizes[i]);
      off += sizes[i];
    }
    d.addr_free(va, total);
  };
  if (!err.empty()) {
    undo(mapped);
    TORCH_CHECK(false, "libsymm: getIpcDevPtr: opening a shared expandable segment: ", err);
  }
  return std::shared_ptr<void>(reinterpret_cast<void *>(va), [this, handle, device, undo, n = hd.num_handles](void *) {
    forget_ipc(handle);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    // Work queued on this device may still read the mapping: unmapping
    // does not wait for it.
    (void)cudaDeviceSynchronize();
    undo(n);
  });
}

// Shares the chunks under ptr's block, from ptr on, in PyTorch's
// expandable-segment format when they are all of one size, else in
// libsymm's (type 'm', _torch_ext_ipc.h): a segment maps chunks of the
// granularity and bigger ones (SYMM_POOL_EXPANDABLE_CHUNK), and a block may
// lie over both. Each chunk's descriptor stays open while a shared block
// covers it (the receiver duplicates it from this process); it is closed
// when the last such block is freed, before the chunk can be unmapped
// (share_book_, _torch_ext_ipc.h). The book's key is the block's start, the
// pointer its free gives back, never ptr: PyTorch shares a storage's
// pointer, which may lie inside the block, and a descriptor kept under it
// would never be closed, and later sent for another physical chunk mapped
// at the same address.
CCA::ShareableHandle SymmAllocator::share_expandable(void *ptr, uint64_t base, uint64_t mapped) {
  const Driver &d = driver();
  uint64_t p = reinterpret_cast<uint64_t>(ptr), block = 0, requested = 0;
  check(SYMM_NEED(block_of)(ptr, &block, &requested), "shareIpcHandle");
  // Each chunk is one physical allocation: each handle sent must be mapped
  // whole, with its own size (symm_pool_chunk_at). A libsymm without it has
  // chunks of one size: symm_pool_segment_chunk's, or the granularity for
  // one without that either.
  std::vector<symm_ipc::Chunk> chunks;
  if (g_api.chunk_at != nullptr) {
    std::string bad = symm_ipc::chunks_at(p, block, requested, base, mapped,
                                          [ptr](uint64_t a) {
                                            symm_ipc::Chunk c{0, 0};
                                            check(g_api.chunk_at(ptr, reinterpret_cast<const void *>(a), &c.base,
                                                                 &c.size),
                                                  "shareIpcHandle");
                                            return c;
                                          },
                                          &chunks);
    TORCH_CHECK(bad.empty(), "libsymm: shareIpcHandle: ", ptr, ": ", bad);
  } else {
    uint64_t g = 0, begin = 0, end = 0;
    if (g_api.segment_chunk != nullptr) check(g_api.segment_chunk(ptr, &g), "shareIpcHandle");
    if (g == 0) {
      int dev = 0;
      C10_CUDA_CHECK(cudaGetDevice(&dev));
      g = vmm_granularity(d, dev);
    }
    TORCH_CHECK(symm_ipc::chunks_under(p, block, requested, base, mapped, g, &begin, &end),
                "libsymm: shareIpcHandle: ", ptr, " is outside its segment's mapped part");
    for (uint64_t a = begin; a + g <= end; a += g) chunks.push_back(symm_ipc::Chunk{a, g});
  }
  std::vector<uint64_t> starts, sizes;
  for (const symm_ipc::Chunk &c : chunks) {
    starts.push_back(c.base);
    sizes.push_back(c.size);
  }
  std::vector<int> fds = share_book_.share(block, starts, [&d](uint64_t a) {
    CUmemGenericAllocationHandle h = 0;
    drv_check(d.retain(&h, reinterpret_cast<void *>(a)), "cuMemRetainAllocationHandle");
    int fd = -1;
    CUresult r = d.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    d.release(h);  // retain took a reference; the mapping keeps the memory
    drv_check(r, "cuMemExportToShareableHandle");
    // The driver's descriptor is inherited across exec: a child that
    // execs (a compiler, a shell, a DataLoader's subprocess) would keep
    // the chunk's memory alive for its whole life. The Go side's are
    // close-on-exec too.
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0) {
      int e = errno;
      close(fd);
      TORCH_CHECK(false, "libsymm: shareIpcHandle: making descriptor ", fd, " close-on-exec: ", strerror(e));
    }
    return fd;
  });
  std::string s = symm_ipc::expandable_handle(getpid(), sizes, fds);
  TORCH_CHECK(!s.empty(), "libsymm: shareIpcHandle: ", ptr, ": chunks of sizes that are not multiples of the smallest");
  return CCA::ShareableHandle{static_cast<ptrdiff_t>(p - chunks.front().base), s};
}

// Called before block (a block's start: the pointer a free gives back)
// goes back to the pool: closes the descriptors of chunks no other shared
// block covers.
void SymmAllocator::unshare(void *block) {
  share_book_.unshare(reinterpret_cast<uint64_t>(block), [](int fd) { close(fd); });
}

}  // namespace

#endif  // SYMM_TORCH_EXT_CUDA_IPC_H
