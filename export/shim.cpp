// The "library" section of the public C ABI (include/symm.h: the version and
// the calling thread's last error) and what every public function relies on:
// the per-thread last error and the fork check (shim_internal.h). The other
// public functions are in torchmode.cpp, routes.cpp, wrappers.cpp and
// pools.cpp; the Go side of the shim sets errors through symmshim_set_error.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/symm.h"
#include "_cgo_export.h"
#include "shim_internal.h"

namespace symmshim {
volatile int g_forked = 0;
}  // namespace symmshim

namespace {
// Last error of the calling thread. Only a pointer is thread-local: Go's
// c-shared libraries use the initial-exec TLS model, so every thread_local
// byte comes out of glibc's small static TLS surplus, and a library that asks
// for too much fails to dlopen ("cannot allocate memory in static TLS block").
// The buffer itself is malloc'd on a thread's first error and freed at its exit.
struct LastError {
  int code;
  char msg[2048];
};
thread_local LastError *t_err;
pthread_key_t g_err_key;

LastError *err_slot() {
  if (t_err == nullptr) {
    t_err = static_cast<LastError *>(calloc(1, sizeof(LastError)));
    if (t_err == nullptr) return nullptr;
    pthread_setspecific(g_err_key, t_err);
  }
  return t_err;
}

void on_fork_child() { symmshim::g_forked = 1; }

__attribute__((constructor)) void install_handlers() {
  pthread_atfork(nullptr, nullptr, on_fork_child);
  pthread_key_create(&g_err_key, free);
}
}  // namespace

namespace symmshim {

void set_error(int code, const char *msg) {
  LastError *e = err_slot();
  if (e == nullptr) return;
  e->code = code;
  snprintf(e->msg, sizeof e->msg, "%s", msg);
}

int fail(int code, const char *msg) {
  set_error(code, msg);
  return code;
}

const char *last_error_msg() { return t_err ? t_err->msg : ""; }

void refuse_forked(const char *fn) {
  char msg[256];
  snprintf(msg, sizeof msg,
           "%s: called in a child process after fork(); libsymm (a Go runtime) "
           "does not survive fork: use it only in the parent, or start children "
           "with spawn/exec",
           fn);
  set_error(SYMM_ERR_FORKED, msg);
}

}  // namespace symmshim

extern "C" {

void symmshim_set_error(int code, const char *msg, size_t len) {
  LastError *e = err_slot();
  if (e == nullptr) return;
  e->code = code;
  if (len >= sizeof e->msg) len = sizeof e->msg - 1;
  memcpy(e->msg, msg, len);
  e->msg[len] = 0;
}

// Go's value (internal/version/VERSION, embedded in Go), never a literal here:
// the version is set in one place.
const char *symm_version(void) { return goVersion(); }
const char *symm_last_error(void) { return symmshim::last_error_msg(); }
int symm_last_error_code(void) { return t_err ? t_err->code : SYMM_OK; }
void symm_clear_error(void) {
  if (t_err != nullptr) {
    t_err->code = SYMM_OK;
    t_err->msg[0] = 0;
  }
}

size_t symm_copy_last_error(char *buf, size_t len) {
  const char *m = symmshim::last_error_msg();
  size_t n = strlen(m);
  if (buf != nullptr && len > 0) {
    size_t k = n < len - 1 ? n : len - 1;
    memcpy(buf, m, k);
    buf[k] = 0;
  }
  return n;
}

}  // extern "C"

// The statistics page (publish.go) goes with the process. A destructor, not
// Go: the Go runtime runs no code at exit. Only the process that made it
// removes it, not a forked child that exits.
static char publish_path[4096];
static pid_t publish_pid;

void symmshim_publish_path(const char *path) {
  snprintf(publish_path, sizeof publish_path, "%s", path);
  publish_pid = getpid();
}

__attribute__((destructor)) static void publish_cleanup(void) {
  if (publish_path[0] != 0 && getpid() == publish_pid) unlink(publish_path);
}
