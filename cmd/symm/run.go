package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// runUsage is `symm run`'s help: libsymm as PyTorch's allocator for a
// command that is not edited (python/symm/_autoload.py does the work).
const runUsage = `usage: symm run [--] COMMAND [ARG]...

Runs COMMAND with libsymm as PyTorch's CUDA allocator in every Python process
it starts (torchrun's workers, DataLoader workers, subprocesses): the moment
a process finishes importing torch, symm.use_as_default() runs, before the
script can initialize CUDA (torch.cuda.set_device may be its first line).

It sets SYMM_TORCH_ALLOCATOR=1 and puts the symm package's _boot directory
(a sitecustomize that runs the one it hides) first on PYTHONPATH, then
replaces itself with COMMAND. An installed wheel honours SYMM_TORCH_ALLOCATOR=1
without symm run.
`

// bootDirs are where the symm package's _boot directory is, relative to
// this executable: a wheel's symm/bin/symm, then a checkout's build/symm.
func bootDirs(exe string) []string {
	dir := filepath.Dir(exe)
	return []string{
		filepath.Join(dir, "..", "_boot"),
		filepath.Join(dir, "..", "python", "symm", "_boot"),
	}
}

// findBoot returns the first of bootDirs(exe) that holds sitecustomize.py.
func findBoot(exe string) (string, error) {
	for _, d := range bootDirs(exe) {
		if st, err := os.Stat(filepath.Join(d, "sitecustomize.py")); err == nil && st.Mode().IsRegular() {
			return filepath.Clean(d), nil
		}
	}
	return "", fmt.Errorf("the symm Python package's _boot/sitecustomize.py is not beside %s (looked in %s): "+
		"run the symm installed with the Python package (pip install symm-*.whl), or build/symm in a checkout",
		exe, strings.Join(bootDirs(exe), ", "))
}

// runEnv is env with SYMM_TORCH_ALLOCATOR=1 and boot first on PYTHONPATH
// (an empty PYTHONPATH entry would add the working directory: none is left).
func runEnv(env []string, boot string) []string {
	out := make([]string, 0, len(env)+2)
	pythonPath := boot
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, "SYMM_TORCH_ALLOCATOR="):
			continue
		case strings.HasPrefix(kv, "PYTHONPATH="):
			if old := strings.TrimPrefix(kv, "PYTHONPATH="); old != "" {
				pythonPath += string(os.PathListSeparator) + old
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "SYMM_TORCH_ALLOCATOR=1", "PYTHONPATH="+pythonPath)
}

// runCommand is `symm run`: on success it does not return (the process is
// COMMAND now).
func runCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	} else if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			fmt.Fprint(stdout, runUsage)
			return exitOK
		}
		if strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(stderr, "symm run: unknown flag %q (put -- before a command that starts with -)\n\n%s", args[0], runUsage)
			return exitUsage
		}
	}
	if len(args) == 0 {
		fmt.Fprintf(stderr, "symm run: no command given\n\n%s", runUsage)
		return exitUsage
	}
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		fmt.Fprintln(stderr, "symm run: where is this executable:", err)
		return exitFailure
	}
	boot, err := findBoot(exe)
	if err != nil {
		fmt.Fprintln(stderr, "symm run:", err)
		return exitFailure
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "symm run: %v\n", err)
		return exitFailure
	}
	err = syscall.Exec(path, args, runEnv(os.Environ(), boot))
	fmt.Fprintf(stderr, "symm run: could not run %s: %v\n", path, err)
	return exitFailure
}
