package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/cuda"
	"github.com/libsymm/libsymm/host"
	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/internal/version"
	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/topology"
)

const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNoDriver = 3
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage: symm <command> [flags]

commands:
  info       GPUs, how they are linked, libraries and backends (--json: machine-readable)
  bench      the pool's cached alloc+free against the driver's, per size
  replay     replay a recorded allocation trace through the pool, no GPU needed:
             peak reserved against peak allocated per configuration
             (https://github.com/libsymm/libsymm/blob/main/docs/REPLAY.md)
  top        every libsymm process of this user on the machine, live: allocated,
             reserved, cached, per device, pool and stream (--json: one snapshot)
  run        run a command with libsymm as PyTorch's CUDA allocator in every Python
             process it starts, with no edit to the script (symm run -- torchrun ...)
  settings   every environment variable libsymm reads, its value here and whether
             the library accepts it (--json, --markdown: the README's table)
  version    libsymm's version

"symm <command> --help" describes a command's flags.
exit codes: 0 success, 1 failure, 2 bad usage, 3 no NVIDIA driver found
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "info":
		return info(args[1:], stdout, stderr)
	case "bench":
		return bench(args[1:], stdout, stderr)
	case "replay":
		return replay(args[1:], stdout, stderr)
	case "top":
		return top(args[1:], stdout, stderr)
	case "run":
		return runCommand(args[1:], stdout, stderr)
	case "settings":
		return settingsCmd(args[1:], stdout, stderr)
	case "version":
		fs := newFlags("version", "", stderr)
		if code, done := parse(fs, args[1:]); done {
			return code
		}
		fmt.Fprintf(stdout, "symm %s\n", version.Version)
		return exitOK
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "symm: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package writes its errors to the output: they name flags
	// as the usage lines do.
	fs.SetOutput(flagErrors{stderr})
	fs.Usage = func() {
		fmt.Fprintln(stderr, strings.TrimSpace("usage: symm "+name+" "+synopsis))
		printDefaults(fs, stderr)
	}
	return fs
}

// flagErrors rewrites the flag package's error lines as the usage lines
// write flags: --name for a flag of more than one letter (the package says
// -name), and a number that does not parse is called that, not "parse
// error".
type flagErrors struct{ w io.Writer }

// dashedFlag is a flag named in a flag package error: after "flag ", "for "
// or ": ", one dash, then a name of two or more letters.
var dashedFlag = regexp.MustCompile(`((?:flag |for |: ))-([A-Za-z][A-Za-z0-9_-]+)`)

func (f flagErrors) Write(p []byte) (int, error) {
	s := dashedFlag.ReplaceAllString(string(p), "${1}--${2}")
	s = strings.ReplaceAll(s, ": parse error", ": not a number")
	if _, err := io.WriteString(f.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}

// printDefaults is flag.PrintDefaults with the flags written as the usage
// lines write them: -x for a one-letter flag, --name for the others (the
// flag package accepts both), and the argument by its name in the usage
// line (the `NAME` quoted in the flag's help).
func printDefaults(fs *flag.FlagSet, w io.Writer) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if arg != "" {
			line += " " + arg
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch f.DefValue {
		case "", "false", "0", "[]":
		default:
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// parse parses args; done is true when the command must end with code
// (help asked for, or bad flags).
func parse(fs *flag.FlagSet, args []string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, true
		}
		return exitUsage, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "symm %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return exitUsage, true
	}
	return 0, false
}

type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ":") }

// Set takes a directory that exists: a mistyped one would otherwise be
// searched in silence and the library reported missing.
func (d *dirList) Set(v string) error {
	fi, err := os.Stat(v)
	switch {
	case err != nil:
		return fmt.Errorf("no directory %s: %w", v, errors.Unwrap(err))
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", v)
	}
	*d = append(*d, v)
	return nil
}

func info(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("info", "[--json] [--lib-dir DIR]...", stderr)
	asJSON := fs.Bool("json", false, "print the topology as JSON (its schema: the README's symm info section)")
	var dirs dirList
	fs.Var(&dirs, "lib-dir", "also look for NCCL and NVSHMEM under `DIR` (repeatable); Python's site-packages are searched too")
	if code, done := parse(fs, args); done {
		return code
	}
	libDirs := append(dirs, pythonSiteDirs()...)
	t, err := topology.Discover(topology.Options{LibraryDirs: libDirs})
	kernels.Probe(t, libDirs, kernels.CacheDir(os.Getenv), true)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if e := enc.Encode(t); e != nil {
			fmt.Fprintln(stderr, "symm info:", e)
			return exitFailure
		}
	} else if e := topology.WriteText(stdout, t); e != nil {
		fmt.Fprintln(stderr, "symm info:", e)
		return exitFailure
	}
	if errors.Is(err, topology.ErrNoDriver) {
		return exitNoDriver
	}
	if err != nil {
		fmt.Fprintln(stderr, "symm info:", err)
		return exitFailure
	}
	return exitOK
}

// pythonSiteDirs asks python3 (SYMM_PYTHON names another) for its
// site-packages, where pip puts NCCL and NVSHMEM. No Python: none.
func pythonSiteDirs() []string {
	py := settings.PythonExe.Get(os.Getenv)
	if py == "" {
		py = "python3"
	}
	cmd := exec.Command(py, "-c", "import site, sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))")
	done := make(chan []byte, 1)
	go func() { out, _ := cmd.Output(); done <- out }()
	select {
	case out := <-done:
		return strings.Fields(string(out))
	case <-time.After(5 * time.Second):
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
		return nil
	}
}

func bench(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("bench", "[--backend cuda|host] [--device N] [--iters N]", stderr)
	backend := fs.String("backend", "", "`cuda|host`: the GPU, or host memory (no GPU needed); default: SYMM_DEVICE's, else cuda")
	dev := fs.Int("device", 0, "device `N` to measure")
	iters := fs.Int("iters", 20000, "`N` alloc+free pairs per size through the pool")
	if code, done := parse(fs, args); done {
		return code
	}
	if *iters < 1 || *dev < 0 {
		fmt.Fprintf(stderr, "symm bench: --iters must be >= 1 and --device >= 0 (got %d, %d)\n", *iters, *dev)
		return exitUsage
	}
	// The backend is chosen as the library chooses it: SYMM_DEVICE, unless
	// --backend says otherwise.
	name, from := *backend, "--backend "+*backend
	if name == "" {
		name = settings.Device.Get(os.Getenv)
		from = fmt.Sprintf("%s=%q", settings.Device.Name, name)
		if name == "" {
			name = "cuda"
		}
	}
	var b allocator.Backend
	switch name {
	case "cuda":
		cb, err := cuda.NewBackend()
		if err != nil {
			fmt.Fprintf(stderr, "symm bench: %v\n(without a GPU: symm bench --backend host, or SYMM_DEVICE=host)\n", err)
			return exitNoDriver
		}
		b = cb
	case "host":
		hb, err := host.New(1, 1<<30)
		if err != nil {
			fmt.Fprintln(stderr, "symm bench:", err)
			return exitFailure
		}
		b = hb
	default:
		fmt.Fprintf(stderr, "symm bench: %s: want cuda or host\n", from)
		return exitUsage
	}
	n, err := b.DeviceCount()
	if err != nil {
		fmt.Fprintf(stderr, "symm bench: counting the %s backend's devices: %v\n", b.Name(), err)
		return exitFailure
	}
	if *dev >= n {
		fmt.Fprintf(stderr, "symm bench: --device %d does not exist: the %s backend has %s\n", *dev, b.Name(), deviceRange(n))
		return exitUsage
	}
	rows, err := measure(b, *dev, *iters)
	if err != nil {
		fmt.Fprintln(stderr, "symm bench:", err)
		return exitFailure
	}
	fmt.Fprintf(stdout, "symm bench: %s backend, device %d, %s\n", b.Name(), *dev, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tpool alloc+free (ns)\tbackend alloc+free (ns)\tratio\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.4f×\t\n", r.size, r.pool, r.raw, r.pool/r.raw)
	}
	tw.Flush()
	return exitOK
}

// deviceRange says how many devices there are and their numbers.
func deviceRange(n int) string {
	switch n {
	case 0:
		return "no devices"
	case 1:
		return "1 device (0)"
	}
	return fmt.Sprintf("%d devices (0 to %d)", n, n-1)
}

type benchRow struct {
	size      string
	pool, raw float64 // ns per pair
}

// measure times cached pool pairs against the backend's own allocation
// (cuMemAlloc + cuMemFree on CUDA), per size.
func measure(b allocator.Backend, dev, iters int) ([]benchRow, error) {
	p, err := allocator.New(b, allocator.Config{})
	if err != nil {
		return nil, err
	}
	defer p.EmptyCache()
	var rows []benchRow
	for _, s := range []struct {
		name string
		n    uint64
	}{{"512 B", 512}, {"1 MiB", 1 << 20}, {"64 MiB", 64 << 20}} {
		ptr, _, err := p.Alloc(dev, 0, s.n) // warm: the segment stays cached
		if err == nil {
			err = p.Free(dev, 0, ptr, s.n)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		start := time.Now()
		for i := 0; i < iters; i++ {
			ptr, _, err := p.Alloc(dev, 0, s.n)
			if err != nil {
				return nil, err
			}
			if err := p.Free(dev, 0, ptr, s.n); err != nil {
				return nil, err
			}
		}
		pool := float64(time.Since(start).Nanoseconds()) / float64(iters)
		rawIters := max(iters/100, 10) // the driver is ~1000x slower
		seg := (s.n + 511) &^ 511
		start = time.Now()
		for i := 0; i < rawIters; i++ {
			ptr, err := b.Alloc(dev, seg)
			if err != nil {
				return nil, err
			}
			if err := b.Free(dev, ptr, seg); err != nil {
				return nil, err
			}
		}
		raw := float64(time.Since(start).Nanoseconds()) / float64(rawIters)
		rows = append(rows, benchRow{s.name, pool, raw})
	}
	return rows, nil
}
