package policy

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Compat is the driver compatibility matrix of driver-compat.yaml: NVIDIA's
// general rule (a guest driver from the host vGPU manager's branch or, for
// recent branches, the previous one; never newer than the host's branch) as
// data, with exceptions and known-good rows.
type Compat struct {
	Branches   []int        // release branches, oldest first
	Rule       CompatRule   //
	Exceptions []CompatPair // checked first; first match wins
	Matrix     []CompatPair // known-good combinations
}

// CompatRule is the general rule.
type CompatRule struct {
	SameBranch          bool // a guest driver of the host's branch is supported
	PreviousBranch      bool // a guest driver of the previous branch is supported …
	PreviousBranchSince int  // … when the host's branch is this one or later
}

// CompatPair is an exception or matrix row. Host and Guest are version
// patterns: "470" (a branch), "470.*" (the same), or an exact version.
type CompatPair struct {
	Hypervisor string // optional: prefix of Host.Hypervisor, case-insensitive
	Host       string
	Guest      string
	Supported  bool
	Reason     string
	Line       int // where it is in the file
}

// Verdict is the answer of Compat.Check.
type Verdict struct {
	Supported bool   `json:"supported"`
	Reason    string `json:"reason"`
}

// Check says whether a guest driver may run on a host with the given
// hypervisor and vGPU manager version. Unknown versions (empty) are
// supported: there is nothing to check.
func (c *Compat) Check(hypervisor, host, guest string) Verdict {
	if c == nil || host == "" || guest == "" {
		return Verdict{Supported: true, Reason: "no driver versions to compare"}
	}
	for _, m := range c.Matrix {
		if m.matches(hypervisor, host, guest) {
			return Verdict{Supported: true, Reason: fmt.Sprintf("host %s / guest %s is a known-good combination (driver-compat line %d)", host, guest, m.Line)}
		}
	}
	for _, e := range c.Exceptions {
		if e.matches(hypervisor, host, guest) {
			r := e.Reason
			if r == "" {
				r = "exception"
			}
			if !e.Supported {
				return Verdict{Supported: false, Reason: fmt.Sprintf("guest driver %s is not supported by host driver %s: %s (driver-compat line %d); the guest would show code 43", guest, host, r, e.Line)}
			}
			return Verdict{Supported: true, Reason: fmt.Sprintf("guest driver %s on host driver %s: %s (driver-compat line %d)", guest, host, r, e.Line)}
		}
	}
	hb, herr := branchOf(host)
	gb, gerr := branchOf(guest)
	if herr != nil || gerr != nil {
		return Verdict{Supported: false, Reason: fmt.Sprintf("cannot compare driver versions host %q and guest %q", host, guest)}
	}
	switch {
	case gb == hb && c.Rule.SameBranch:
		return Verdict{Supported: true, Reason: fmt.Sprintf("guest driver %s is from host branch %d", guest, hb)}
	case gb > hb:
		return Verdict{Supported: false, Reason: fmt.Sprintf("guest driver %s is newer than host branch %d; the guest would show code 43", guest, hb)}
	case gb < hb && c.Rule.PreviousBranch && hb >= c.Rule.PreviousBranchSince && c.previous(hb) == gb:
		return Verdict{Supported: true, Reason: fmt.Sprintf("guest driver %s is from branch %d, the one before host branch %d", guest, gb, hb)}
	}
	return Verdict{Supported: false, Reason: fmt.Sprintf("guest driver %s is not supported by host branch %d; the guest would show code 43", guest, hb)}
}

// Supported is Check's verdict without the reason (no allocation).
func (c *Compat) Supported(hypervisor, host, guest string) bool {
	if c == nil || host == "" || guest == "" {
		return true
	}
	for _, m := range c.Matrix {
		if m.matches(hypervisor, host, guest) {
			return true
		}
	}
	for _, e := range c.Exceptions {
		if e.matches(hypervisor, host, guest) {
			return e.Supported
		}
	}
	hb, herr := branchOf(host)
	gb, gerr := branchOf(guest)
	if herr != nil || gerr != nil {
		return false
	}
	return gb == hb && c.Rule.SameBranch ||
		gb < hb && c.Rule.PreviousBranch && hb >= c.Rule.PreviousBranchSince && c.previous(hb) == gb
}

// previous returns the branch before b in Branches, or 0.
func (c *Compat) previous(b int) int {
	for i, x := range c.Branches {
		if x == b && i > 0 {
			return c.Branches[i-1]
		}
	}
	return 0
}

func (p CompatPair) matches(hypervisor, host, guest string) bool {
	if p.Hypervisor != "" && !strings.HasPrefix(strings.ToLower(hypervisor), strings.ToLower(p.Hypervisor)) {
		return false
	}
	return versionMatches(p.Host, host) && versionMatches(p.Guest, guest)
}

// versionMatches: "*" any; "470" or "470.*" a branch; else exact.
func versionMatches(pattern, v string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasSuffix(pattern, ".*"):
		return strings.HasPrefix(v, strings.TrimSuffix(pattern, "*"))
	case !strings.Contains(pattern, "."):
		b, err := branchOf(v)
		return err == nil && strconv.Itoa(b) == pattern
	}
	return pattern == v
}

var errNoBranch = errors.New("driver version has no release branch")

// branchOf returns the release branch of a driver version ("470.82.01" → 470).
func branchOf(v string) (int, error) {
	head, _, _ := strings.Cut(strings.TrimSpace(v), ".")
	b, err := strconv.Atoi(head)
	if err != nil || b <= 0 {
		return 0, errNoBranch
	}
	return b, nil
}

func checkVersionPattern(p string) error {
	if p == "*" {
		return nil
	}
	q := strings.TrimSuffix(p, ".*")
	for _, part := range strings.Split(q, ".") {
		if part == "" {
			return fmt.Errorf("version %q: empty part", p)
		}
		for _, r := range part {
			if r < '0' || r > '9' {
				return fmt.Errorf("version %q: want digits and dots, e.g. 470.82.01, 470 or 470.*", p)
			}
		}
	}
	return nil
}

// LoadCompatFile reads driver-compat.yaml.
func LoadCompatFile(path string) (*Compat, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load driver compatibility: %w", err)
	}
	defer f.Close()
	c, err := LoadCompat(f)
	var le *LoadError
	if errors.As(err, &le) {
		le.File = path
	}
	return c, err
}

// LoadCompat reads a driver compatibility document; see
// etc/vgpu-bridge/driver-compat.yaml for the format.
func LoadCompat(r io.Reader) (*Compat, error) {
	root, _, err := readDoc(r)
	if err != nil {
		var le *LoadError
		if errors.As(err, &le) {
			return nil, le
		}
		return nil, fmt.Errorf("load driver compatibility: %w", err)
	}
	c := &Compat{Rule: CompatRule{SameBranch: true}}
	if root == nil {
		return c, nil
	}
	w := &walker{}
	w.mapping(root, "driver compatibility", []string{"branches", "rule", "exceptions", "matrix"}, func(key string, k, v *yaml.Node) {
		switch key {
		case "branches":
			list, nodes := w.strList(v, "branches")
			prev := 0
			for i, s := range list {
				b, err := strconv.Atoi(s)
				if err != nil || b <= 0 {
					w.errf(nodes[i], "branch %q: want a positive integer such as 470", s)
					continue
				}
				if b <= prev {
					w.errf(nodes[i], "branches must be listed oldest first; %d after %d", b, prev)
				}
				prev = b
				c.Branches = append(c.Branches, b)
			}
		case "rule":
			w.mapping(v, "rule", []string{"same_branch", "previous_branch", "previous_branch_since"}, func(key string, k, v *yaml.Node) {
				switch key {
				case "same_branch":
					c.Rule.SameBranch = w.boolean(v, key)
				case "previous_branch":
					c.Rule.PreviousBranch = w.boolean(v, key)
				case "previous_branch_since":
					c.Rule.PreviousBranchSince, _ = w.integer(v, key, 0, 100000)
				}
			})
		case "exceptions", "matrix":
			if isNull(v) {
				return
			}
			if v.Kind != yaml.SequenceNode {
				w.errf(v, "%s must be a list", key)
				return
			}
			for _, it := range v.Content {
				p := CompatPair{Supported: key == "matrix", Line: it.Line}
				var hostSet, guestSet bool
				allowed := []string{"hypervisor", "host", "guest", "supported", "reason"}
				if key == "matrix" {
					allowed = []string{"hypervisor", "host", "guest", "note"}
				}
				w.mapping(it, key+" row", allowed, func(f string, fk, fv *yaml.Node) {
					switch f {
					case "hypervisor":
						p.Hypervisor = w.str(fv, f)
					case "host", "guest":
						s := w.str(fv, f)
						if err := checkVersionPattern(s); err != nil {
							w.errf(fv, "%s %v", f, err)
						}
						if f == "host" {
							p.Host, hostSet = s, true
						} else {
							p.Guest, guestSet = s, true
						}
					case "supported":
						p.Supported = w.boolean(fv, f)
					case "reason", "note":
						p.Reason = w.str(fv, f)
					}
				})
				if it.Kind == yaml.MappingNode && (!hostSet || !guestSet) {
					w.errf(it, "%s row needs both host and guest", key)
				}
				if key == "matrix" {
					c.Matrix = append(c.Matrix, p)
				} else {
					c.Exceptions = append(c.Exceptions, p)
				}
			}
		}
	})
	if c.Rule.PreviousBranch && len(c.Branches) == 0 {
		w.errf(root, "rule.previous_branch needs the branches list to know which branch comes before which")
	}
	if len(w.errs) > 0 {
		return nil, &LoadError{Errors: w.errs}
	}
	return c, nil
}

// GuestBranches lists the guest driver release branches a host with the
// given hypervisor and vGPU manager version serves, oldest first, by
// Supported at the granularity of a branch: the known branches and the
// host's own. Exceptions and matrix rows naming exact guest versions do
// not change a branch's answer. Nil without a matrix or a host version.
func (c *Compat) GuestBranches(hypervisor, host string) []int {
	if c == nil || host == "" {
		return nil
	}
	hb, err := branchOf(host)
	if err != nil {
		return nil
	}
	branches := c.Branches
	if !slices.Contains(branches, hb) {
		branches = append(slices.Clone(branches), hb)
		slices.Sort(branches)
	}
	var out []int
	for _, b := range branches {
		if c.Supported(hypervisor, host, strconv.Itoa(b)) {
			out = append(out, b)
		}
	}
	return out
}
