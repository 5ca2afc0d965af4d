/* A fake NVRTC for the tests of package kernels without a CUDA toolkit: it
 * "compiles" any source that has no #error into a CUBIN-shaped blob (ELF
 * magic, then the architecture option and the source), and fails a source
 * with #error with a log, as NVRTC does. */
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *src, *out, *log;
  size_t out_n;
} prog;

int nvrtcVersion(int *major, int *minor) {
  *major = 13;
  *minor = 0;
  return 0;
}

const char *nvrtcGetErrorString(int r) {
  switch (r) {
    case 0: return "NVRTC_SUCCESS";
    case 5: return "NVRTC_ERROR_INVALID_OPTION";
    case 6: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR_INTERNAL_ERROR";
  }
}

int nvrtcCreateProgram(prog **p, const char *src, const char *name, int nh, const char *const *h, const char *const *hn) {
  (void)name; (void)nh; (void)h; (void)hn;
  *p = calloc(1, sizeof **p);
  (*p)->src = strdup(src);
  return 0;
}

int nvrtcCompileProgram(prog *p, int n, const char *const *opts) {
  const char *arch = NULL;
  for (int i = 0; i < n; i++)
    if (strncmp(opts[i], "--gpu-architecture=sm_", 22) == 0) arch = opts[i] + 19;
  if (arch == NULL) return 5;
  if (strstr(p->src, "#error") != NULL) {
    p->log = strdup("fake.cu(1): error: #error directive: fake failure\n");
    return 6;
  }
  p->out_n = 4 + strlen(arch) + 1 + strlen(p->src);
  p->out = malloc(p->out_n);
  memcpy(p->out, "\x7f" "ELF", 4);
  strcpy(p->out + 4, arch);
  memcpy(p->out + 4 + strlen(arch) + 1, p->src, strlen(p->src));
  p->log = strdup("");
  return 0;
}

int nvrtcGetProgramLogSize(prog *p, size_t *n) {
  *n = p->log ? strlen(p->log) + 1 : 1;
  return 0;
}

int nvrtcGetProgramLog(prog *p, char *out) {
  strcpy(out, p->log ? p->log : "");
  return 0;
}

int nvrtcGetCUBINSize(prog *p, size_t *n) {
  *n = p->out_n;
  return p->out ? 0 : 7;
}

int nvrtcGetCUBIN(prog *p, char *out) {
  if (p->out == NULL) return 7;
  memcpy(out, p->out, p->out_n);
  return 0;
}

int nvrtcDestroyProgram(prog **p) {
  free((*p)->src);
  free((*p)->out);
  free((*p)->log);
  free(*p);
  *p = NULL;
  return 0;
}
