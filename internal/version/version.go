package version

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var raw string

// Version of libsymm, e.g. "0.1.0".
var Version = strings.TrimSpace(raw)
