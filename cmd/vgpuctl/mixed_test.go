package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestMixedHostsAndPlace: vgpuctl hosts shows a host's mixed GPUs'
// framebuffer (MIXED FB FREE, "-" without any), and vgpuctl place a
// mixed candidate's free framebuffer in MiB and the mixed GPUs that
// cannot take the request with why.
func TestMixedHostsAndPlace(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/hosts":
			io.WriteString(w, `{"hosts":[{"name":"cn1","node":"cn1","gpu_count":1,"mixed_gpu_count":1,"capacity":0,"used":0,"free":0,
				"framebuffer":{"total_mib":72091,"used_mib":35840,"free_mib":36251},"traits":[]},
				{"name":"cn2","node":"cn2","gpu_count":2,"capacity":8,"used":1,"free":7,"traits":[]}]}`)
		case "/v1/placements/dry-run":
			io.WriteString(w, `{"candidates":[{"host":"cn1","node":"cn1","provider_uuid":"p1","pci_address":"0000:c1:00.0","profile":"H200X-35C",
				"amount":1,"free_after":36251,"needs_retype":false,"mode":"mixed","framebuffer_mib":35840,"reason":"mixed GPU: fits"}],
				"rejected":[{"host":"cn3","node":"cn3","provider_uuid":"p3","pci_address":"0000:c2:00.0","amount":1,"free_after":0,
				"needs_retype":false,"mode":"mixed","framebuffer_mib":35840,"reason":"GPU drained"}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	code, out, errs := vgpuctl("hosts", "--url", srv.URL)
	if code != 0 {
		t.Fatalf("hosts: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "MIXED FB FREE") || !strings.Contains(out, "36251/72091 MiB (1 GPU)") {
		t.Errorf("hosts lacks the mixed framebuffer:\n%s", out)
	}
	if l := lineWith(out, "cn2"); !strings.HasSuffix(strings.TrimSpace(l), "-") {
		t.Errorf("hosts row of cn2 (no mixed GPU) = %q, want - last", l)
	}
	code, out, errs = vgpuctl("place", "--dry-run", "--profile", "H200X-35C", "--url", srv.URL)
	if code != 0 {
		t.Fatalf("place: exit %d: %s", code, errs)
	}
	if !strings.Contains(lineWith(out, "0000:c1:00.0"), "36251 MiB") || !strings.Contains(out, "cannot take it now") ||
		!strings.Contains(out, "cn3 0000:c2:00.0: GPU drained") {
		t.Errorf("place output:\n%s", out)
	}
}

func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
