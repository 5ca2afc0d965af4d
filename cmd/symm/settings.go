package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/libsymm/libsymm/allocator"
	"github.com/libsymm/libsymm/internal/settings"
	"github.com/libsymm/libsymm/symmetric"
)

// settingRow is one setting as `symm settings --json` prints it.
type settingRow struct {
	Name    string `json:"name"`
	Value   string `json:"value"` // "" when unset
	Set     bool   `json:"set"`
	Default string `json:"default"`
	Reader  string `json:"reader"`
	When    string `json:"when"`
	Help    string `json:"help"`
}

// settingsCheck is what the library's own parsers say of this environment.
type settingsCheck struct {
	Part  string `json:"part"`
	Error string `json:"error,omitempty"` // "" when every value is accepted
}

// settingsCmd lists every environment variable libsymm reads (the registry
// of package settings) with this environment's value, and checks the
// library's values with the parsers the library uses, so that a bad value
// shows here before a job starts.
func settingsCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("settings", "[--json | --markdown]", stderr)
	asJSON := fs.Bool("json", false, "print the settings and the checks as JSON")
	markdown := fs.Bool("markdown", false, "print the README's table of settings")
	if code, done := parse(fs, args); done {
		return code
	}
	if *markdown {
		fmt.Fprint(stdout, settings.Markdown())
		return exitOK
	}
	var rows []settingRow
	for _, s := range settings.All {
		v, set := os.LookupEnv(s.Name)
		rows = append(rows, settingRow{Name: s.Name, Value: v, Set: set, Default: s.Default,
			Reader: string(s.Reader), When: s.When, Help: s.Help})
	}
	checks := checkSettings(os.Getenv)
	code := exitOK
	for _, c := range checks {
		if c.Error != "" {
			code = exitFailure
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Settings []settingRow    `json:"settings"`
			Checks   []settingsCheck `json:"checks"`
		}{rows, checks}); err != nil {
			fmt.Fprintln(stderr, "symm settings:", err)
			return exitFailure
		}
		return code
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "variable\tvalue\tdefault\tread by")
	for _, r := range rows {
		v := "(unset)"
		if r.Set {
			v = fmt.Sprintf("%q", r.Value)
		}
		def := strings.ReplaceAll(r.Default, "`", "")
		if def == "" {
			def = "none"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, v, def, r.Reader)
	}
	tw.Flush()
	for _, c := range checks {
		if c.Error == "" {
			fmt.Fprintf(stdout, "%s: ok\n", c.Part)
		} else {
			fmt.Fprintf(stdout, "%s: %s\n", c.Part, c.Error)
		}
	}
	return code
}

// checkSettings runs the library's parsers over getenv: the pool's
// (allocator.ConfigFromEnv), symmetric memory's (symmetric.ConfigFromEnv)
// and the push workspace's (symmetric.PushMaxBytesFromEnv).
func checkSettings(getenv func(string) string) []settingsCheck {
	errText := func(err error) string {
		if err != nil {
			return err.Error()
		}
		return ""
	}
	_, _, poolErr := allocator.ConfigFromEnv(getenv)
	_, symmErr := symmetric.ConfigFromEnv(getenv)
	_, pushErr := symmetric.PushMaxBytesFromEnv(getenv)
	return []settingsCheck{
		{Part: "pool", Error: errText(poolErr)},
		{Part: "symmetric memory", Error: errText(symmErr)},
		{Part: "push workspace", Error: errText(pushErr)},
	}
}
