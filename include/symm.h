/*
 * symm.h — the public C ABI of libsymm.
 *
 * This header is the contract: every exported symm_* symbol is declared here
 * and nowhere else (a test checks both directions against the built library).
 *
 * Conventions
 *  - Functions returning int return SYMM_OK (0) on success and a positive
 *    SYMM_ERR_* code on failure.
 *  - Every failure records a message in the calling thread's last-error slot:
 *    read it with symm_last_error() / symm_last_error_code(). A success does
 *    not clear it; call symm_clear_error() first when you need to tell.
 *  - Functions returning void (the PyTorch functor signatures) report failure
 *    only through the last-error slot.
 *  - Streams are CUstream / cudaStream_t values passed as void*; NULL is the
 *    legacy default stream, (void*)1 and (void*)2 are CU_STREAM_LEGACY and
 *    CU_STREAM_PER_THREAD.
 *  - After fork(), every call in the child fails with SYMM_ERR_FORKED: the Go
 *    runtime does not survive fork.
 */
#ifndef SYMM_H
#define SYMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes. */
enum {
  SYMM_OK = 0,
  SYMM_ERR_INVALID = 1,        /* bad argument: device out of range, bad fraction, ... */
  SYMM_ERR_OUT_OF_MEMORY = 2,  /* device out of memory or pool limit reached (after one retry) */
  SYMM_ERR_NO_DEVICE = 3,      /* no CUDA driver / no GPU, and SYMM_DEVICE=host not set */
  SYMM_ERR_UNKNOWN_POINTER = 4,/* free/record_stream of a pointer this pool did not hand out (or already freed) */
  SYMM_ERR_FORKED = 5,         /* called from a forked child */
  SYMM_ERR_DRIVER = 6,         /* the CUDA driver returned an error; the message has its name */
  SYMM_ERR_INTERNAL = 7        /* a bug in libsymm (a recovered panic); the message says where */
};

/* ---- library ---------------------------------------------------------- */

/* The library's version, e.g. "0.1.0". Never NULL; static storage. */
const char *symm_version(void);

/* The calling thread's last failure message, or "" if none. The pointer is
 * valid until the thread's next failing call. Never NULL. */
const char *symm_last_error(void);

/* The SYMM_ERR_* code of the calling thread's last failure, SYMM_OK if none. */
int symm_last_error_code(void);

/* Clears the calling thread's last failure. */
void symm_clear_error(void);

/* Copies the last failure message into buf (always NUL-terminated when
 * len > 0). Returns the message's full length, as snprintf does. */
size_t symm_copy_last_error(char *buf, size_t len);

/* ---- caching pool ------------------------------------------------------ */

/* Allocates size bytes on device, for use on stream. Returns a pointer aligned
 * to at least 512 bytes, or NULL with the last error set. size 0 returns NULL
 * and records no error (PyTorch sends 0-byte requests).
 * Signature of PyTorch's CUDAPluggableAllocator alloc functor. */
void *symm_pool_alloc(size_t size, int device, void *stream);

/* Returns ptr to the pool. size, device and stream are those given at
 * allocation (PyTorch passes them). The block is reused on the same stream at
 * once and on other streams only after the work queued on its streams has
 * completed. NULL is ignored. An unknown or already freed pointer sets
 * SYMM_ERR_UNKNOWN_POINTER and changes nothing.
 * Signature of PyTorch's CUDAPluggableAllocator free functor. */
void symm_pool_free(void *ptr, size_t size, int device, void *stream);

/* Selects the backend and creates the per-device pools. Optional: the first
 * allocation does it too. device_count is advisory (PyTorch passes its own). */
void symm_pool_init(int device_count);

/* symm_pool_init for PyTorch's replace mode (set_init_fn): besides init, it
 * makes symm_pool_alloc throw a C++ std::runtime_error carrying the message
 * instead of returning NULL, because PyTorch's CUDAPluggableAllocator::malloc
 * turns NULL into a tensor with a NULL data pointer. Never use it from C. */
void symm_torch_init(int device_count);

/* Returns every unused cached segment of every device to the driver. */
void symm_pool_empty_cache(void);

/* Caps device's reserved memory at fraction (0 < fraction <= 1) of its total
 * memory. A bad fraction or device sets SYMM_ERR_INVALID and changes nothing. */
void symm_pool_set_memory_fraction(double fraction, int device);

/* Caps device's reserved memory at bytes (0 removes the cap). */
int symm_pool_set_limit(int device, uint64_t bytes);

/* Marks ptr (an allocated block, or any pointer inside one) as used on stream:
 * when it is freed it is reused only after the work queued on stream at free
 * time has completed. Same stream as the allocation: no effect. */
void symm_pool_record_stream(void *ptr, void *stream);

/* One statistic: name as PyTorch's torch.cuda.memory_stats() keys it. */
typedef struct {
  const char *name; /* static storage, owned by the library */
  int64_t value;
} symm_stat_t;

/* Writes up to cap statistics of device into out and returns how many the
 * library has (call with out=NULL, cap=0 to size the array), or -1 with the
 * last error set (bad device). */
int symm_pool_stats(int device, symm_stat_t *out, int cap);

/* Resets every peak statistic of device to its current value. */
int symm_pool_reset_peak(int device);

/* Number of devices the pool serves (initializing the backend if needed),
 * or -1 with the last error set. */
int symm_pool_device_count(void);

/* Name of the active backend ("cuda", "host"), or "" before init. */
const char *symm_pool_backend(void);

#ifdef __cplusplus
}
#endif
#endif /* SYMM_H */
