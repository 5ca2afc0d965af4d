# libsymm build. `make` builds the library, checks it against the header,
# builds the command-line tool (build/symm) and the C tests; `make test` runs every test; `make run` runs the demo.
GO      ?= go
CC      ?= gcc
PYTHON  ?= python3
BUILD   := build
LIB     := $(BUILD)/libsymm.so
GOFILES := $(shell find . -name '*.go' -not -path './build/*') go.mod go.sum
CSRC    := $(wildcard export/*.cpp export/*.h) include/symm.h export/symm.map
CTESTS  := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/*.c)) \
           $(patsubst tests/c/%.cpp,$(BUILD)/tests/%,$(wildcard tests/c/*.cpp))
CXX     ?= g++
VERSION := $(shell cat internal/version/VERSION)
# Only the public ABI is exported (export/symm.map); the cgo flag check does
# not allow a version script in #cgo LDFLAGS, so it is passed here, with the
# soname that make install's links and programs linked with -lsymm use.
LDFLAGS := -extldflags=-Wl,--version-script=$(CURDIR)/export/symm.map,-soname,libsymm.so.0
# make install (PREFIX, DESTDIR as usual)
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR     ?= $(PREFIX)/bin
PCDIR      ?= $(LIBDIR)/pkgconfig
FUZZTIME ?= 20s

.PHONY: all lib cli check-header ctests test test-steps test-go test-kernels test-torch-ext test-c test-python test-packaging fuzz run device bench clean fmt \
	wheel install uninstall set-version cross-arm64 print-ldflags

all: lib check-header cli ctests

lib: $(LIB)

cli: $(BUILD)/symm

$(BUILD)/symm: $(GOFILES)
	@mkdir -p $(BUILD)
	$(GO) build -trimpath -o $@ ./cmd/symm

$(LIB): $(GOFILES) $(CSRC) internal/version/VERSION
	@mkdir -p $(BUILD)
	$(GO) build -buildmode=c-shared -trimpath -ldflags '$(LDFLAGS)' -o $@ ./export
	@ln -sf libsymm.so $(BUILD)/libsymm.so.0  # the soname, for programs linked here

# The library's link flags, for a script that builds it another way
# (tests/cross_arm64.sh): `make -s --no-print-directory print-ldflags`.
print-ldflags:
	@echo '$(LDFLAGS)'

# Every exported symm_* symbol is declared in include/symm.h and vice versa;
# no multicast entry point is referenced.
check-header: $(LIB)
	@bash tests/check_abi.sh $(LIB) include/symm.h

ctests: $(CTESTS)

$(BUILD)/tests/%: tests/c/%.c tests/c/check.h include/symm.h $(LIB)
	@mkdir -p $(BUILD)/tests
	$(CC) -O1 -g -Wall -Wextra -Werror -Iinclude $< -L$(BUILD) -lsymm -Wl,-rpath,'$$ORIGIN/..' -lpthread -o $@

# C++ tests: the PyTorch functors (symm_torch_*_pool) take std:: types.
$(BUILD)/tests/%: tests/c/%.cpp tests/c/check.h include/symm.h $(LIB)
	@mkdir -p $(BUILD)/tests
	$(CXX) -O1 -g -Wall -Wextra -Werror -Iinclude $< -L$(BUILD) -lsymm -Wl,-rpath,'$$ORIGIN/..' -lpthread -o $@

# The extension's IPC-handle parsing, tested without torch or CUDA.
$(BUILD)/tests/test_torch_ext_ipc: python/symm/_torch_ext_ipc.h

# Every step, then no statistics page (symm top's, /dev/shm/libsymm-*) of a
# process that is gone may be left: tests/check_pages.sh names and removes them.
TEST_STEPS := all test-go test-kernels test-torch-ext test-c test-python test-packaging cross-arm64 fuzz

test:
	@bash tests/check_pages.sh $(MAKE) --no-print-directory test-steps
	@echo "make test: passed: $(TEST_STEPS); no statistics page left behind"

test-steps: $(TEST_STEPS)

test-go:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(MAKE) -s $(BUILD)/bin/staticcheck
	$(BUILD)/bin/staticcheck ./...
	$(GO) test -race -count=1 ./...

# Built once and kept in build/bin: `go run pkg@version` asks the module
# proxy on every run, so a later make test would need the network.
$(BUILD)/bin/staticcheck:
	GOBIN=$(CURDIR)/$(BUILD)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.6.1

# A real NVRTC compiles the kernel source (kernels/symm.cu) for every
# architecture libsymm runs on: pip's nvidia-cuda-nvrtc wheel, downloaded once
# into build/nvrtc (no GPU needed; PyTorch's CUDA 13 wheels use the same).
NVRTC_LIB := $(BUILD)/nvrtc/nvidia/cu13/lib/libnvrtc.so.13
$(NVRTC_LIB):
	@rm -rf $(BUILD)/nvrtc && mkdir -p $(BUILD)/nvrtc/wheel
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --dest $(BUILD)/nvrtc/wheel 'nvidia-cuda-nvrtc>=13,<14'
	$(PYTHON) -m zipfile -e $$(ls $(BUILD)/nvrtc/wheel/nvidia_cuda_nvrtc-*.whl | head -1) $(BUILD)/nvrtc
	@test -f $@

test-kernels: $(NVRTC_LIB)
	SYMM_REQUIRE_NVRTC=1 SYMM_NVRTC_LIB=$(CURDIR)/$(NVRTC_LIB) $(GO) test -count=1 -v \
		-run 'TestSymmSourceCompiles|TestCompileWithRealNVRTC' ./kernels

# libsymm's PyTorch extension compiles against a real torch's headers
# (pip's torch wheel, headers only; no GPU, no torch install needed).
test-torch-ext:
	PYTHON=$(PYTHON) bash tests/check_torch_ext.sh

# Each C test runs with the front cache on and off (the default), and with
# expandable segments of the default chunk (20 MiB) and of 2 MiB chunks.
test-c: ctests
	@for t in $(CTESTS); do for mode in "1 0" "0 0" "1 1" "1 1 2MiB"; do set -- $$mode; \
		echo "== $$t (SYMM_POOL_FRONT_CACHE=$$1 SYMM_POOL_EXPANDABLE=$$2 SYMM_POOL_EXPANDABLE_CHUNK=$${3:-})"; \
		SYMM_DEVICE=host SYMM_POOL_FRONT_CACHE=$$1 SYMM_POOL_EXPANDABLE=$$2 SYMM_POOL_EXPANDABLE_CHUNK=$${3:-} \
			timeout 300 $$t || exit 1; \
	done; done

test-python: lib $(BUILD)/bench/bench_trace
	SYMM_LIB=$(CURDIR)/$(LIB) PYTHONPATH=python $(PYTHON) -m pytest -q tests/python

# No tracked build output; the wheel installs and runs in a fresh venv;
# make install + pkg-config build the C example.
test-packaging: all
	@bash tests/check_no_binaries.sh
	$(MAKE) -s wheel
	bash tests/wheel_smoke.sh
	bash tests/install_smoke.sh
	bash tests/source_install_smoke.sh

# The library and the tool cross-compiled for linux/arm64 (GH200/GB200
# hosts): build/arm64/. Installs the aarch64 cross compiler if missing.
cross-arm64:
	bash tests/cross_arm64.sh

# The platform wheel of the Python package with libsymm.so and the symm tool
# inside (tools/build_wheel.py): build/dist/symm-VERSION-py3-none-manylinux_2_N_ARCH.whl.
wheel: lib cli
	$(PYTHON) tools/build_wheel.py --lib $(LIB) --tool $(BUILD)/symm --out $(BUILD)/dist

install: lib cli
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(PCDIR)
	install -m 0755 $(LIB) $(DESTDIR)$(LIBDIR)/libsymm.so.0
	ln -sf libsymm.so.0 $(DESTDIR)$(LIBDIR)/libsymm.so
	install -m 0644 include/symm.h $(DESTDIR)$(INCLUDEDIR)/symm.h
	install -m 0755 $(BUILD)/symm $(DESTDIR)$(BINDIR)/symm
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
		-e 's|@VERSION@|$(VERSION)|' tools/symm.pc.in > $(DESTDIR)$(PCDIR)/symm.pc

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libsymm.so.0 $(DESTDIR)$(LIBDIR)/libsymm.so $(DESTDIR)$(INCLUDEDIR)/symm.h \
		$(DESTDIR)$(BINDIR)/symm $(DESTDIR)$(PCDIR)/symm.pc

# The version is set in internal/version/VERSION; this also updates the
# header's SYMM_VERSION (a test checks the two agree).
set-version:
	@test -n "$(V)" || { echo "usage: make set-version V=x.y.z"; exit 2; }
	echo "$(V)" > internal/version/VERSION
	sed -i 's/^#define SYMM_VERSION ".*"/#define SYMM_VERSION "$(V)"/' include/symm.h

# Short fuzzing of every fuzz target, found in the _test.go files (longer: make fuzz FUZZTIME=10m).
fuzz:
	@bash tests/fuzz_all.sh $(FUZZTIME)

# The demo: on a machine with an NVIDIA GPU and PyTorch it trains a small
# model on the pool; otherwise it runs on the host backend.
run: all
	@if $(PYTHON) -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then \
		SYMM_LIB=$(CURDIR)/$(LIB) PYTHONPATH=python $(PYTHON) examples/demo.py; \
	else \
		echo "no CUDA-capable PyTorch here: running the host-backend demo (SYMM_DEVICE=host)"; \
		SYMM_DEVICE=host SYMM_LIB=$(CURDIR)/$(LIB) PYTHONPATH=python $(PYTHON) examples/demo.py; \
	fi

# Test binaries for the GPU machine (it has no Go): bash tests/device/run.sh there.
device: all $(BUILD)/bench/bench_threads $(BUILD)/bench/bench_launch $(BUILD)/bench/bench_trace $(BUILD)/tests/gpu_symm $(BUILD)/tests/gpu_collectives
	@mkdir -p $(BUILD)/device
	$(GO) test -c -o $(BUILD)/device/cuda.test ./cuda
	$(GO) test -c -o $(BUILD)/device/export.test ./export
	$(GO) test -c -o $(BUILD)/device/topology.test ./topology
	$(GO) test -c -o $(BUILD)/device/symmetric.test ./symmetric
	$(GO) test -c -o $(BUILD)/device/kernels.test ./kernels

# C programs for the GPU machine (tests/device/run.sh runs build/tests/gpu_*).
$(BUILD)/tests/gpu_%: tests/device/gpu_%.c tests/device/cudadrv.h tests/c/check.h include/symm.h $(LIB)
	@mkdir -p $(BUILD)/tests
	$(CC) -O1 -g -Wall -Wextra -Werror -Iinclude $< -L$(BUILD) -lsymm -Wl,-rpath,'$$ORIGIN/..' -ldl -lpthread -o $@

# The collectives test on the CUDA backend: tests/c/test_collectives.c with -DSYMM_GPU.
$(BUILD)/tests/gpu_collectives: tests/c/test_collectives.c tests/device/cudadrv.h tests/c/check.h include/symm.h $(LIB)
	@mkdir -p $(BUILD)/tests
	$(CC) -O1 -g -Wall -Wextra -Werror -DSYMM_GPU -Iinclude $< -L$(BUILD) -lsymm -Wl,-rpath,'$$ORIGIN/..' -ldl -lpthread -o $@

$(BUILD)/bench/bench_threads: bench/c/bench_threads.c include/symm.h $(LIB)
	@mkdir -p $(BUILD)/bench
	$(CC) -O2 -Wall -Iinclude $< -L$(BUILD) -lsymm -Wl,-rpath,'$$ORIGIN/..' -lpthread -o $@

$(BUILD)/bench/bench_launch: bench/c/bench_launch.c tests/device/cudadrv.h include/symm.h $(LIB)
	@mkdir -p $(BUILD)/bench
	$(CC) -O2 -Wall -Werror -Iinclude $< -L$(BUILD) -lsymm -Wl,-rpath,'$$ORIGIN/..' -ldl -o $@

$(BUILD)/bench/bench_trace: bench/c/bench_trace.c include/symm.h $(LIB)
	@mkdir -p $(BUILD)/bench
	$(CC) -O2 -Wall -Werror -Iinclude $< -L$(BUILD) -lsymm -Wl,-rpath,'$$ORIGIN/..' -o $@

# Go microbenchmarks, the trace replay, and the C thread-scaling benchmark
# (host backend), with the front cache off (the default) and on. The PyTorch
# benchmark needs a GPU: python3 bench/bench_torch.py.
bench: all $(BUILD)/bench/bench_threads $(BUILD)/bench/bench_trace
	$(GO) test ./allocator ./export -run '^$$' -bench . -benchmem
	$(GO) test ./bench -count=1 -v -run TestReplayGPT2Trace
	SYMM_DEVICE=host SYMM_POOL_FRONT_CACHE=0 $(BUILD)/bench/bench_threads
	SYMM_DEVICE=host SYMM_POOL_FRONT_CACHE=1 $(BUILD)/bench/bench_threads

fmt:
	gofmt -w $$(find . -name '*.go' -not -path './build/*')

clean:
	rm -rf $(BUILD)
