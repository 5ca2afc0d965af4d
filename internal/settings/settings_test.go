package settings

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFlag(t *testing.T) {
	s := &Setting{Name: "SYMM_X", Want: "want 1 (on) or 0 (off)"}
	for v, want := range map[string]bool{"": true, "1": true, "0": false} {
		on, err := s.Flag(envOf(map[string]string{"SYMM_X": v}), true)
		require.NoError(t, err, v)
		assert.Equal(t, want, on, v)
	}
	for _, v := range []string{"yes", "true", " 1", "2", "on"} {
		_, err := s.Flag(envOf(map[string]string{"SYMM_X": v}), false)
		assert.EqualError(t, err, "SYMM_X="+strconv.Quote(v)+": want 1 (on) or 0 (off)")
	}
}

func TestWord(t *testing.T) {
	s := &Setting{Name: "SYMM_X", Want: "want a or b"}
	v, err := s.Word(envOf(nil), "a", "b")
	require.NoError(t, err)
	assert.Equal(t, "", v)
	v, err = s.Word(envOf(map[string]string{"SYMM_X": "b"}), "a", "b")
	require.NoError(t, err)
	assert.Equal(t, "b", v)
	_, err = s.Word(envOf(map[string]string{"SYMM_X": "B"}), "a", "b")
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, Error{Name: "SYMM_X", Value: "B", Want: "want a or b"}, *e)
}

func TestUint(t *testing.T) {
	s := &Setting{Name: "SYMM_X", Want: "want a count from %d to %d"}
	n, set, err := s.Uint(envOf(nil), 10, 1, 9)
	assert.NoError(t, err)
	assert.False(t, set)
	assert.Zero(t, n)
	n, set, err = s.Uint(envOf(map[string]string{"SYMM_X": "9"}), 10, 1, 9)
	assert.NoError(t, err)
	assert.True(t, set)
	assert.EqualValues(t, 9, n)
	for _, v := range []string{"0", "10", "-1", "x", "0x5", "1.5"} {
		_, set, err = s.Uint(envOf(map[string]string{"SYMM_X": v}), 10, 1, 9)
		assert.True(t, set)
		assert.EqualError(t, err, "SYMM_X="+strconv.Quote(v)+": want a count from 1 to 9", v)
	}
	n, _, err = s.Uint(envOf(map[string]string{"SYMM_X": "0x5"}), 0, 1, 9)
	assert.NoError(t, err)
	assert.EqualValues(t, 5, n)
}

// TestRegistry holds each entry to the rules its users rely on: one entry
// per name, a help that fits a table cell, a Want where the value is checked
// by this package's readers (refusals name what is accepted).
func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range All {
		assert.False(t, seen[s.Name], "%s registered twice", s.Name)
		seen[s.Name] = true
		assert.Same(t, s, Lookup(s.Name))
		assert.NotEmpty(t, s.Help, s.Name)
		assert.LessOrEqual(t, len([]rune(s.Help)), HelpMax, "%s: help over %d characters: move the detail to docs/SETTINGS.md", s.Name, HelpMax)
		assert.NotContains(t, s.Help, "|", s.Name)
		assert.NotEmpty(t, s.When, s.Name)
		assert.Contains(t, []Reader{Library, Python, Tool, Tests}, s.Reader, s.Name)
	}
	assert.Nil(t, Lookup("SYMM_NO_SUCH"))
}

// TestREADMETable holds the README's table of environment variables to the
// registry, and docs/SETTINGS.md to one section per setting (and every link
// of a help to one of them).
func TestREADMETable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	assert.Contains(t, string(readme), Markdown(),
		"README.md's table of environment variables differs from the registry: paste `go run ./cmd/symm settings --markdown` over it")
	docs, err := os.ReadFile("../../docs/SETTINGS.md")
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^## `([A-Z0-9_]+)`$").FindAllStringSubmatch(string(docs), -1) {
		anchors[strings.ToLower(m[1])] = true
	}
	for _, s := range All {
		assert.True(t, anchors[strings.ToLower(s.Name)], "docs/SETTINGS.md has no section ## `%s`", s.Name)
		for _, m := range regexp.MustCompile(`docs/SETTINGS\.md#([a-z0-9_]+)`).FindAllStringSubmatch(s.Help, -1) {
			assert.True(t, anchors[m[1]], "%s links to docs/SETTINGS.md#%s, which has no section", s.Name, m[1])
		}
	}
	assert.Len(t, anchors, len(All), "docs/SETTINGS.md describes a setting the registry does not have")
}

// TestEveryReaderUsesTheRegistry scans the library's Go sources (tests
// aside) for an environment variable read by a literal name: every read of
// a setting goes through its *Setting, so that the registry lists every
// variable libsymm reads.
func TestEveryReaderUsesTheRegistry(t *testing.T) {
	readers := map[string]bool{"getenv": true, "Getenv": true, "LookupEnv": true, "Get": true}
	// Variables read that are not libsymm's settings: the user's home and
	// cache directories.
	foreign := map[string]bool{"HOME": true, "XDG_CACHE_HOME": true}
	root := "../.."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "build" || d.Name() == "python") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !readers[name] || !ok || lit.Kind != token.STRING {
				return true
			}
			v, _ := strconv.Unquote(lit.Value)
			if regexp.MustCompile(`^[A-Z][A-Z0-9_]+$`).MatchString(v) && !foreign[v] {
				t.Errorf("%s: %s(%q): read it through its settings.Setting (add one to internal/settings/table.go)", path, name, v)
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
}

// TestPythonReadsRegisteredNames: every SYMM_ variable the Python package
// names (to read it, or to set it for the library) is in the registry.
func TestPythonReadsRegisteredNames(t *testing.T) {
	name := regexp.MustCompile(`["'](SYMM_[A-Z0-9_]+)["']`)
	n := 0
	err := filepath.WalkDir("../../python/symm", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".py") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range name.FindAllStringSubmatch(string(b), -1) {
			n++
			assert.NotNil(t, Lookup(m[1]), "%s names %s, which internal/settings/table.go does not register", path, m[1])
		}
		return nil
	})
	require.NoError(t, err)
	assert.Positive(t, n, "no variable found: the scan is broken")
}

// TestTorchAllocatorWords holds SYMM_TORCH_ALLOCATOR's help and refusal to
// the words its one reader accepts (python/symm/_boot/symm_autoload.py).
func TestTorchAllocatorWords(t *testing.T) {
	src, err := os.ReadFile("../../python/symm/_boot/symm_autoload.py")
	require.NoError(t, err)
	on := regexp.MustCompile(`(?m)^ON = \(([^)]*)\)`).FindSubmatch(src)
	require.NotNil(t, on, "symm_autoload.py has no ON tuple")
	words := regexp.MustCompile(`"([a-z0-9]+)"`).FindAllSubmatch(on[1], -1)
	require.NotEmpty(t, words)
	for _, w := range words {
		assert.Contains(t, TorchAllocator.Help, "`"+string(w[1])+"`")
	}
	assert.Contains(t, string(src), TorchAllocator.Want)
}

// TestPythonRefusalsAreTheRegistrys: a setting Python parses refuses a
// value with the registry's Want (Python has no Go to ask before the
// library is loaded; its message is held to the registry instead).
func TestPythonRefusalsAreTheRegistrys(t *testing.T) {
	var src strings.Builder
	require.NoError(t, filepath.WalkDir("../../python/symm", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".py") {
			return err
		}
		b, err := os.ReadFile(path)
		src.Write(b)
		return err
	}))
	for _, s := range All {
		if s.Reader == Python && s.Want != "" {
			assert.Contains(t, src.String(), s.Want, "%s: Python's refusal is not the registry's Want", s.Name)
		}
	}
}
