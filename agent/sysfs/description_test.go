package sysfs

import (
	"reflect"
	"testing"
)

func TestParseDescription(t *testing.T) {
	tests := []struct {
		in      string
		want    Description
		wantErr bool
	}{
		{"num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320, max_instance=12",
			Description{NumHeads: 4, FRLConfig: 60, FramebufferMB: 2048, MaxResolution: "7680x4320", MaxWidth: 7680, MaxHeight: 4320, MaxInstance: 12}, false},
		{"num_heads=1, frl_config=60, framebuffer=16384M, max_resolution=4096x2160, max_instance=1\n",
			Description{NumHeads: 1, FRLConfig: 60, FramebufferMB: 16384, MaxResolution: "4096x2160", MaxWidth: 4096, MaxHeight: 2160, MaxInstance: 1}, false},
		{"framebuffer=1G,max_instance=16", Description{FramebufferMB: 1024, MaxInstance: 16}, false},
		{"", Description{}, false},
		{"num_heads=4, vendor=x", Description{NumHeads: 4, Extra: map[string]string{"vendor": "x"}}, false},
		{"num_heads=four, framebuffer=2048M", Description{FramebufferMB: 2048}, true},
		{"garbage", Description{}, true},
		{"max_resolution=7680", Description{}, true},
		{"max_instance=-1", Description{}, true},
	}
	for _, tc := range tests {
		got, err := ParseDescription(tc.in)
		if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseDescription(%q) = %+v, %v; want %+v, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func FuzzParseDescription(f *testing.F) {
	f.Add("num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320, max_instance=12")
	f.Add("framebuffer=1G")
	f.Add("max_resolution=x,=,,")
	f.Add("framebuffer=99999999999999999999M")
	f.Fuzz(func(t *testing.T, s string) {
		d, _ := ParseDescription(s)
		if d.NumHeads < 0 || d.MaxInstance < 0 || d.FRLConfig < 0 || d.MaxWidth < 0 || d.MaxHeight < 0 {
			t.Fatalf("negative field from %q: %+v", s, d)
		}
		if (d.MaxResolution == "") != (d.MaxWidth == 0 && d.MaxHeight == 0) && d.MaxResolution != "0x0" {
			t.Fatalf("resolution fields disagree: %+v", d)
		}
	})
}
