// Package catalog is the vGPU profile catalog: profile names (T4-4Q),
// mediated-device or vendor-VFIO type ids (nvidia-232, 1428), the Placement
// trait Nova derives from a type id (CUSTOM_NVIDIA_232), framebuffer size,
// instances per physical GPU and series.
//
// It is a leaf: it imports nothing of this module, so placement, policy and
// the agent can all share it. Type ids differ between driver versions, so the
// catalog is seeded from etc/vgpu-bridge/profiles.yaml and then corrected by
// what agents report (Observe).
package catalog

import (
	"fmt"
	"strconv"
	"strings"
)

// Series is the letter that ends an NVIDIA vGPU profile name.
type Series string

// The vGPU series.
const (
	SeriesQ Series = "Q" // virtual workstation (RTX vWS), rendering
	SeriesC Series = "C" // compute (NVIDIA AI Enterprise)
	SeriesB Series = "B" // virtual PC (business)
	SeriesA Series = "A" // virtual applications
)

// Valid reports whether s is one of the four series.
func (s Series) Valid() bool {
	switch s {
	case SeriesQ, SeriesC, SeriesB, SeriesA:
		return true
	}
	return false
}

// ParsedName is what a vGPU profile name says about itself.
type ParsedName struct {
	Name           string // canonical short form: "T4-4Q", "A100-4-20C"
	GPU            string // "T4", "A100", "H200X"
	FramebufferMiB int    // 4096 for 4Q; 512 for 0B/0Q
	Series         Series
	MIGSlices      int    // compute slices of a MIG-backed profile (4 in A100-4-20C), else 0
	Suffix         string // what follows the series letter: "4" in T4-2B4, "ME" in A100-1-5CME
}

// NameError says why a string is not a vGPU profile name.
type NameError struct {
	Input  string
	Reason string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("vGPU profile name %q: %s", e.Input, e.Reason)
}

// vendorPrefixes are the words drivers put before the profile in sysfs
// "name" files ("GRID T4-4Q", "NVIDIA A40-2Q").
var vendorPrefixes = []string{"GRID ", "NVIDIA ", "Tesla "}

// ParseName parses a vGPU profile name as drivers report it ("GRID T4-4Q",
// "NVIDIA A40-2Q", "NVIDIA H200X-141C", "GRID M60-0B", "A100-4-20C",
// "GRID T4-2B4", "A100-1-5CME") or in its short form ("T4-4Q"). Lower case
// is accepted and returned upper-cased. The framebuffer is the number before
// the series letter in GiB, with 0 meaning 512 MiB.
func ParseName(s string) (ParsedName, error) {
	in := s
	s = strings.TrimSpace(s)
	for _, p := range vendorPrefixes {
		if len(s) > len(p) && strings.EqualFold(s[:len(p)], p) {
			s = strings.TrimSpace(s[len(p):])
			break
		}
	}
	if s == "" {
		return ParsedName{}, &NameError{in, "empty"}
	}
	if len(s) > 64 {
		return ParsedName{}, &NameError{in, "longer than 64 characters"}
	}
	s = strings.ToUpper(s)
	parts := strings.Split(s, "-")
	if len(parts) < 2 || len(parts) > 3 {
		return ParsedName{}, &NameError{in, "want GPU-<GiB><series> or GPU-<slices>-<GiB><series>, e.g. T4-4Q or A100-4-20C"}
	}
	gpu := parts[0]
	if gpu == "" {
		return ParsedName{}, &NameError{in, "no GPU model before '-'"}
	}
	for _, r := range gpu {
		if !(r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return ParsedName{}, &NameError{in, fmt.Sprintf("GPU model %q has character %q; want letters and digits", gpu, r)}
		}
	}
	p := ParsedName{GPU: gpu}
	if len(parts) == 3 {
		n, err := strconv.Atoi(parts[1])
		if err != nil || n < 1 || n > 8 || parts[1][0] == '0' {
			return ParsedName{}, &NameError{in, fmt.Sprintf("MIG slice count %q is not a number from 1 to 8", parts[1])}
		}
		p.MIGSlices = n
	}
	tail := parts[len(parts)-1]
	i := 0
	for i < len(tail) && tail[i] >= '0' && tail[i] <= '9' {
		i++
	}
	if i == 0 {
		return ParsedName{}, &NameError{in, fmt.Sprintf("%q does not start with the framebuffer size in GiB", tail)}
	}
	if i > 4 {
		return ParsedName{}, &NameError{in, fmt.Sprintf("framebuffer %q GiB is implausible", tail[:i])}
	}
	gib, _ := strconv.Atoi(tail[:i])
	if i == len(tail) {
		return ParsedName{}, &NameError{in, fmt.Sprintf("no series letter (Q, C, B or A) after %q", tail)}
	}
	p.Series = Series(tail[i : i+1])
	if !p.Series.Valid() {
		return ParsedName{}, &NameError{in, fmt.Sprintf("series %q is not one of Q, C, B, A", tail[i:i+1])}
	}
	p.Suffix = tail[i+1:]
	switch p.Suffix {
	case "", "4", "ME":
	default:
		return ParsedName{}, &NameError{in, fmt.Sprintf("unknown suffix %q after the series letter", p.Suffix)}
	}
	if gib == 0 {
		if p.MIGSlices > 0 {
			return ParsedName{}, &NameError{in, "a MIG-backed profile cannot have 0 GiB"}
		}
		p.FramebufferMiB = 512
	} else {
		p.FramebufferMiB = gib * 1024
	}
	p.Name = s
	return p, nil
}

// TraitFor returns the Placement trait Nova reports for a vGPU type id, as
// os_traits.normalize_name does: each run of characters other than ASCII
// letters and digits becomes one '_', the result is upper-cased and prefixed
// with CUSTOM_ ("nvidia-232" → "CUSTOM_NVIDIA_232").
func TraitFor(typeID string) string {
	var b strings.Builder
	b.Grow(len("CUSTOM_") + len(typeID))
	b.WriteString("CUSTOM_")
	under := false
	for i := 0; i < len(typeID); i++ {
		c := typeID[i]
		switch {
		case c >= 'a' && c <= 'z':
			b.WriteByte(c - 'a' + 'A')
			under = false
		case c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			b.WriteByte(c)
			under = false
		default:
			if !under {
				b.WriteByte('_')
				under = true
			}
		}
	}
	return b.String()
}
