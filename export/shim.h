/* Internal to export/: what the Go side calls in the C++ shim. */
#ifndef SYMM_SHIM_H
#define SYMM_SHIM_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Records code and the len bytes at msg (not NUL-terminated) as the calling
 * thread's last error. Copies: msg may be Go memory. */
void symmshim_set_error(int code, const char *msg, size_t len);
/* 1 if the process is a fork child of the process that loaded the library. */
int symmshim_forked(void);
/* The front cache (front.cpp): switch it on; hand its blocks back to the pool. */
void symmshim_front_enable(int on, uint64_t max_block);
int symmshim_front_parked_fit(int dev, uintptr_t stream, uint64_t lo, uint64_t hi);
void symmshim_front_drain_fit(int dev, uintptr_t stream, uint64_t lo, uint64_t hi);
void symmshim_front_drain(int dev);
/* 1 if the front cache holds blocks of device dev. */
int symmshim_front_parked(int dev);
#ifdef __cplusplus
}
#endif
#endif
