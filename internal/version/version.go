// Package version is the build's version and commit, shown by every
// binary (`version`, --version), at the bridge's / and in its metrics.
//
// `make build` sets them from the nearest git tag, or else from the
// VERSION file and the commit (Makefile). A plain `go build` in a clone
// leaves them empty, and the Go toolchain's VCS stamp stands in.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// Set by the linker (-X).
var (
	version string
	commit  string
)

var once = sync.OnceValues(func() (string, string) {
	v, c := version, commit
	if v != "" && c != "" {
		return v, c
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return or(v, "dev"), or(c, "unknown")
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	return or(v, "dev"), or(c, rev, "unknown")
})

func or(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// Version is the release ("0.1.0", "0.1.0-3-gabc1234" past a tag,
// "0.1.0.dev0+abc1234" between releases), or "dev".
func Version() string { v, _ := once(); return v }

// Commit is the source commit (short), or "unknown".
func Commit() string { _, c := once(); return c }

// String is the line `version` prints: name, version, commit, Go and
// platform.
func String(name string) string {
	return fmt.Sprintf("%s %s (commit %s, %s %s/%s)", name, Version(), Commit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
