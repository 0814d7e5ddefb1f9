package pipeline

import (
	"testing"
	"time"
)

func TestLoadMetrics(t *testing.T) {
	now := time.Unix(10_000, 0)
	s := func(ago int, util, fb float64) loadSample { return loadSample{float64(10_000 - ago), util, fb} }
	tests := []struct {
		name    string
		samples []loadSample
		window  time.Duration
		want    map[string]float64
	}{
		{"window", []loadSample{s(3600, 99, 1), s(600, 20, 100), s(300, 80, 200), s(0, 50, 300)}, 30 * time.Minute,
			map[string]float64{"gpu_util": 50, "gpu_util_avg": 50, "gpu_util_min": 20, "gpu_util_max": 80, "fb_used_mib": 300,
				"load_samples": 3, "load_span_s": 600}},
		{"one sample", []loadSample{s(10, 7, 64)}, time.Minute,
			map[string]float64{"gpu_util": 7, "gpu_util_avg": 7, "gpu_util_min": 7, "gpu_util_max": 7, "fb_used_mib": 64, "load_samples": 1, "load_span_s": 0}},
		{"all too old", []loadSample{s(120, 7, 64)}, time.Minute, nil},
		{"none", nil, time.Minute, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := LoadMetrics(tc.samples, now, tc.window)
			if ok != (tc.want != nil) || len(got) != len(tc.want) {
				t.Fatalf("LoadMetrics = %v, %v; want %v", got, ok, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}
