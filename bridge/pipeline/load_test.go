package pipeline

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

func TestLoadMetrics(t *testing.T) {
	now := time.Unix(10_000, 0)
	nan := math.NaN()
	s := func(ago int, util, fb float64) loadSample {
		return loadSample{float64(10_000 - ago), util, fb, nan, nan}
	}
	codec := func(ago int, util, enc, dec float64) loadSample {
		return loadSample{float64(10_000 - ago), util, 512, enc, dec}
	}
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
		// Reports from before the codecs were carried count for the SM
		// figures only.
		{"codecs", []loadSample{s(240, 10, 512), codec(120, 20, 60, 10), codec(0, 30, 30, nan)}, time.Hour,
			map[string]float64{"gpu_util": 30, "gpu_util_avg": 20, "gpu_util_min": 10, "gpu_util_max": 30, "fb_used_mib": 512,
				"enc_util": 30, "enc_util_avg": 45, "load_samples": 3, "load_span_s": 240}},
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

// TestLoadSampleJSON: windows kept before the codecs were reported (three
// numbers) and codecs a report did not carry (null) read as NaN.
func TestLoadSampleJSON(t *testing.T) {
	var got []loadSample
	if err := json.Unmarshal([]byte(`[[100, 40, 512], [160, 50, 512, 20, null], [220, 60, 512, 25, 5]]`), &got); err != nil {
		t.Fatal(err)
	}
	want := [][5]float64{{100, 40, 512, -1, -1}, {160, 50, 512, 20, -1}, {220, 60, 512, 25, 5}}
	for i := range want {
		for j := range want[i] {
			if g := got[i][j]; (want[i][j] == -1) != math.IsNaN(g) || (!math.IsNaN(g) && g != want[i][j]) {
				t.Errorf("sample %d field %d = %v, want %v (-1: NaN)", i, j, g, want[i][j])
			}
		}
	}
	if err := json.Unmarshal([]byte(`[["x"]]`), &got); err == nil {
		t.Error("a sample of strings decoded without an error")
	}
}
