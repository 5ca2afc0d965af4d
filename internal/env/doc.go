// Package env is the one reader of libsymm's environment variables.
//
// It reads the C environment (getenv(3)), never Go's copy: in libsymm.so,
// Go's os.Getenv sees the environment as it was when the library was
// loaded, and misses what a program sets afterwards (Python's
// os.environ["SYMM_DEVICE"] = "host" before the first allocation, PyTorch's
// launchers). In a Go program the two agree: os.Setenv also sets the C
// environment when cgo is linked. Every package of the library (the
// driver's and the libraries' paths in cuda and topology, the settings
// export hands to symmetric and allocator) reads through Get.
package env
