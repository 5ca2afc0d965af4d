/*
 * shim_graphs.h — package cuda's trampolines for CUDA graph capture
 * (graph_capture_record_stream_reuse): a stream's capture state and
 * dependencies, free-marker nodes, and a node's dependencies. Included by
 * shim.h, whose conventions it follows (results by value, handles as
 * integers, everything static).
 */
#ifndef SYMM_CUDA_SHIM_GRAPHS_H
#define SYMM_CUDA_SHIM_GRAPHS_H

/* ---- CUDA graph capture (graph_capture_record_stream_reuse) --------------- */
/* CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated. Graphs and nodes
 * travel as integers, like the other handles. The functions come in two
 * ABIs: CUDA 12.0's (cuStreamGetCaptureInfo_v2, cuGraphNodeGetDependencies,
 * cuStreamUpdateCaptureDependencies) and CUDA 12.3's with edge data (_v3,
 * _v2, _v2; the only ones CUDA 13's headers declare). edges selects the
 * latter; edge data is asked for and ignored, so that a graph with
 * programmatic edges does not make the query fail (CUDA_ERROR_LOSSY_QUERY). */
typedef struct { unsigned char b[8]; } symm_edge_data; /* CUgraphEdgeData */

typedef struct {
  CUresult r;
  int status;
  unsigned long long id;
  uintptr_t graph;
  size_t n; /* dependencies; at most cap copied to deps */
} symm_res_capture;

static inline symm_res_capture symm_cuStreamGetCaptureInfo(
    void *fn, int edges, uintptr_t stream, uintptr_t *deps, size_t cap) {
  symm_res_capture o = {0, 0, 0, 0, 0};
  void *graph = NULL;
  void *const *d = NULL;
  const symm_edge_data *e = NULL;
  if (edges)
    o.r = ((CUresult(*)(CUstream, int *, unsigned long long *, void **,
                        void *const **, const symm_edge_data **, size_t *))fn)(
        (CUstream)stream, &o.status, &o.id, &graph, &d, &e, &o.n);
  else
    o.r = ((CUresult(*)(CUstream, int *, unsigned long long *, void **,
                        void *const **, size_t *))fn)(
        (CUstream)stream, &o.status, &o.id, &graph, &d, &o.n);
  o.graph = (uintptr_t)graph;
  if (o.r == 0 && d != NULL)
    for (size_t i = 0; i < o.n && i < cap; i++) deps[i] = (uintptr_t)d[i];
  return o;
}

/* A free marker: an empty node after stream's capture dependencies, made
 * the stream's only dependency (CU_STREAM_SET_CAPTURE_DEPENDENCIES, 1).
 * In one call, because the dependency array the driver returns is valid
 * only until the next call on the stream. step says which call failed:
 * 1 cuStreamGetCaptureInfo, 2 cuGraphAddEmptyNode,
 * 3 cuStreamUpdateCaptureDependencies. node is 0 unless status is active. */
typedef struct {
  CUresult r;
  int step;
  int status;
  unsigned long long id;
  uintptr_t node;
} symm_res_mark;

static inline symm_res_mark symm_capture_mark(void *info, int info_edges,
                                              void *add, void *update,
                                              int update_edges,
                                              uintptr_t stream) {
  symm_res_mark o = {0, 1, 0, 0, 0};
  void *graph = NULL;
  void *const *d = NULL;
  const symm_edge_data *e = NULL;
  size_t n = 0;
  if (info_edges)
    o.r = ((CUresult(*)(CUstream, int *, unsigned long long *, void **,
                        void *const **, const symm_edge_data **, size_t *))info)(
        (CUstream)stream, &o.status, &o.id, &graph, &d, &e, &n);
  else
    o.r = ((CUresult(*)(CUstream, int *, unsigned long long *, void **,
                        void *const **, size_t *))info)(
        (CUstream)stream, &o.status, &o.id, &graph, &d, &n);
  if (o.r != 0 || o.status != 1) return o;
  o.step = 2;
  void *node = NULL;
  o.r = ((CUresult(*)(void **, void *, void *const *, size_t))add)(&node, graph,
                                                                  d, n);
  if (o.r != 0) return o;
  o.step = 3;
  if (update_edges)
    o.r = ((CUresult(*)(CUstream, void **, const symm_edge_data *, size_t,
                        unsigned int))update)((CUstream)stream, &node, NULL, 1, 1);
  else
    o.r = ((CUresult(*)(CUstream, void **, size_t, unsigned int))update)(
        (CUstream)stream, &node, 1, 1);
  if (o.r == 0) o.node = (uintptr_t)node;
  return o;
}

/* cuGraphNodeGetDependencies: the count, and at most cap of them in deps.
 * With edges (the _v2 ABI) edge data goes to a scratch buffer. */
typedef struct { CUresult r; size_t n; } symm_res_count;

static inline symm_res_count symm_cuGraphNodeGetDependencies(
    void *fn, int edges, uintptr_t node, uintptr_t *deps, size_t cap) {
  symm_res_count o = {0, 0};
  if (edges)
    o.r = ((CUresult(*)(void *, void **, symm_edge_data *, size_t *))fn)(
        (void *)node, NULL, NULL, &o.n);
  else
    o.r = ((CUresult(*)(void *, void **, size_t *))fn)((void *)node, NULL, &o.n);
  if (o.r != 0 || o.n == 0 || o.n > cap) return o;
  size_t n = o.n;
  if (edges) {
    symm_edge_data *e = (symm_edge_data *)calloc(n, sizeof *e);
    if (e == NULL) { o.r = 2; return o; } /* CUDA_ERROR_OUT_OF_MEMORY */
    o.r = ((CUresult(*)(void *, void **, symm_edge_data *, size_t *))fn)(
        (void *)node, (void **)deps, e, &n);
    free(e);
  } else {
    o.r = ((CUresult(*)(void *, void **, size_t *))fn)((void *)node,
                                                       (void **)deps, &n);
  }
  if (o.r == 0 && n < o.n) o.n = n;
  return o;
}

/* For tests on a GPU: cuStreamBeginCapture_v2 (mode 2: relaxed),
 * cuStreamEndCapture, cuGraphDestroy, cuStreamWaitEvent. */
static inline CUresult symm_cuStreamBeginCapture(void *fn, uintptr_t stream,
                                                 int mode) {
  return ((CUresult(*)(CUstream, int))fn)((CUstream)stream, mode);
}
static inline symm_res_ptr symm_cuStreamEndCapture(void *fn, uintptr_t stream) {
  symm_res_ptr o = {0, 0};
  void *g = NULL;
  o.r = ((CUresult(*)(CUstream, void **))fn)((CUstream)stream, &g);
  o.v = (uintptr_t)g;
  return o;
}
static inline CUresult symm_cuGraphDestroy(void *fn, uintptr_t graph) {
  return ((CUresult(*)(void *))fn)((void *)graph);
}
static inline CUresult symm_cuStreamWaitEvent(void *fn, uintptr_t stream,
                                              uintptr_t ev) {
  return ((CUresult(*)(CUstream, CUevent, unsigned int))fn)((CUstream)stream,
                                                            (CUevent)ev, 0);
}

#endif /* SYMM_CUDA_SHIM_GRAPHS_H */
