package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestGuestBranches(t *testing.T) {
	c, err := LoadCompat(strings.NewReader(`branches: [470, 525, 535, 550, 570]
rule: {same_branch: true, previous_branch: true, previous_branch_since: 535}
exceptions:
  - {host: "550.54.16", guest: "535", supported: false, reason: "known to fail"}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, hypervisor, host string
		want                   []int
	}{
		{"same and previous branch", "KVM", "570.86.10", []int{550, 570}},
		{"before previous_branch_since: same only", "KVM", "525.105.17", []int{525}},
		{"an exception takes a branch out", "KVM", "550.54.16", []int{550}},
		{"another version of that branch keeps it", "KVM", "550.90.07", []int{535, 550}},
		{"a branch the file does not list", "KVM", "580.65.06", []int{580}},
		{"no version", "KVM", "", nil},
		{"not a version", "KVM", "unknown", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.GuestBranches(tt.hypervisor, tt.host); !slices.Equal(got, tt.want) {
				t.Errorf("GuestBranches(%q, %q) = %v, want %v", tt.hypervisor, tt.host, got, tt.want)
			}
		})
	}
	var none *Compat
	if got := none.GuestBranches("KVM", "550.54.16"); got != nil {
		t.Errorf("without a matrix: %v, want none", got)
	}
}
