// Command symm tells what GPUs a machine has, how they are linked and which
// libsymm backends can run there, and measures libsymm's pool: its speed
// (bench), and what it would reserve for a recorded workload (replay, no GPU
// needed; docs/REPLAY.md).
//
//	symm info [--json] [--lib-dir DIR]...   devices, links, libraries, backends
//	symm bench [--backend cuda|host] [--device N] [--iters N]   (backend: SYMM_DEVICE's by default)
//	symm replay TRACE [--expandable] [--limit SIZE] [--max-split SIZE] [--chunk SIZE] [--capacity SIZE] [--json]
//	symm top [--json] [--once] [-n N] [--interval D] [--sort COLUMN] [--pid PID] [--record FILE] [--dir DIR]
//	symm run [--] COMMAND [ARG]...   COMMAND with libsymm as PyTorch's allocator, unedited
//	symm settings [--json | --markdown]   every environment variable, its value here, the library's checks
//	symm version
//
// Exit codes: 0 success; 1 a failure while running; 2 bad usage; 3 no
// NVIDIA driver found (info still prints what it knows, bench asks for
// --backend host or SYMM_DEVICE=host).
//
// Files: main.go (the commands and info, bench, version), replay.go (symm
// replay; the format and options are in docs/REPLAY.md), plot.go (its
// --plot charts, SVG written by hand), top.go (symm top), toptui.go (its live
// view, drawn with tcell), toprecord.go (top --record), settings.go (symm settings: the
// registry of internal/settings, checked by the library's parsers), run.go (symm run: the
// Python package's _boot directory put first on PYTHONPATH with
// SYMM_TORCH_ALLOCATOR=1). It is built as build/symm.
package main
