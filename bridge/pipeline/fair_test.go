package pipeline

import (
	"slices"
	"testing"
)

func TestInterleave(t *testing.T) {
	c := func(ids ...int64) []candidate {
		var out []candidate
		for _, id := range ids {
			out = append(out, candidate{id: id})
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		byProject [][]candidate
		n         int
		want      []int64
	}{
		{"turns", [][]candidate{c(1, 2, 3), c(10, 11)}, 10, []int64{1, 10, 2, 11, 3}},
		{"bounded", [][]candidate{c(1, 2, 3), c(10, 11), c(20)}, 4, []int64{1, 10, 20, 2}},
		{"one project", [][]candidate{c(5, 6, 7)}, 2, []int64{5, 6}},
		{"none", nil, 5, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int64
			for _, x := range interleave(tc.byProject, tc.n) {
				got = append(got, x.id)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("interleave = %v, want %v", got, tc.want)
			}
		})
	}
}
