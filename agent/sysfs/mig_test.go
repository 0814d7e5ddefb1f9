package sysfs

import "testing"

func TestMIGBacked(t *testing.T) {
	for _, tc := range []struct {
		name string
		mig  bool
	}{
		{"GRID A100-1-5C", true},
		{"NVIDIA A100-7-40C", true},
		{"NVIDIA H100XM-2-20C", true},
		{"GRID A30-1-6CME", true},
		{"NVIDIA H200X-1-18C", true},
		{"GRID A100-4C", false},
		{"GRID T4-4Q", false},
		{"NVIDIA L40S-48Q", false},
		{"NVIDIA H200X-141C", false},
		{"GRID RTX6000-4Q", false},
		{"", false},
		{"A100-1-5C", true},
		{"mtty-1", false},
	} {
		if got := MIGBacked(tc.name); got != tc.mig {
			t.Errorf("MIGBacked(%q) = %v, want %v", tc.name, got, tc.mig)
		}
	}
}
